#version 450 core
#pragma use_vulkan_memory_model
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
layout(local_size_x = 128) in;
layout(set=0, binding=0) buffer A { float16_t a[]; };
layout(set=0, binding=1) buffer C { float c[]; };
shared float16_t a_tile[64*16];
shared float c_tile[1024];
void main() {
  uint li = gl_LocalInvocationIndex;
  a_tile[li] = a[li];
  barrier();
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> ma;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> mb;
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> mc = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
  coopMatLoad(ma, a_tile, 16*gl_SubgroupID, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(mb, a_tile, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  mc = coopMatMulAdd(ma, mb, mc);
  coopMatStore(mc, c_tile, 256*gl_SubgroupID, 16, gl_CooperativeMatrixLayoutRowMajor);
  barrier();
  c[li] = c_tile[li];
}
