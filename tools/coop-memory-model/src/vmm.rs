//! Makes naga 30's SPIR-V for modules that declare the Vulkan memory model (every module with a
//! cooperative-matrix type) synchronise workgroup memory as glslang does for `shared`: each
//! Workgroup OpStore / OpCooperativeMatrixStoreKHR gets `MakePointerAvailable|NonPrivatePointer
//! Workgroup`, each Workgroup OpLoad / OpCooperativeMatrixLoadKHR `MakePointerVisible|
//! NonPrivatePointer Workgroup`. Modules on the GLSL450 model are returned unchanged.
const OP_TYPE_INT: u32 = 21;
const OP_TYPE_POINTER: u32 = 32;
const OP_CONSTANT: u32 = 43;
const OP_FUNCTION: u32 = 54;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_MEMORY_MODEL: u32 = 14;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;
const SC_WORKGROUP: u32 = 4;
const MM_VULKAN: u32 = 3;
const SCOPE_WORKGROUP: u32 = 2;
const AVAILABLE: u32 = 0x8 | 0x20; // MakePointerAvailable | NonPrivatePointer
const VISIBLE: u32 = 0x10 | 0x20; // MakePointerVisible | NonPrivatePointer

pub fn patch(words: &[u32]) -> (Vec<u32>, usize) {
    let insts = |w: &[u32]| {
        let mut v = Vec::new();
        let mut i = 5;
        while i < w.len() {
            let n = (w[i] >> 16) as usize;
            v.push((i, n, w[i] & 0xffff));
            i += n.max(1);
        }
        v
    };
    let list = insts(words);
    let mut vulkan = false;
    let mut uint = None;
    let mut wg_types = std::collections::HashSet::new();
    let mut wg = std::collections::HashSet::new();
    let mut consts = Vec::new();
    let mut first_fn = words.len();
    for &(i, _n, op) in &list {
        let w = &words[i..];
        match op {
            OP_MEMORY_MODEL => vulkan = w[2] == MM_VULKAN,
            OP_TYPE_INT if w[2] == 32 && w[3] == 0 => uint = Some(w[1]),
            OP_TYPE_POINTER if w[2] == SC_WORKGROUP => {
                wg_types.insert(w[1]);
            }
            OP_CONSTANT => consts.push((w[1], w[2], w[3])),
            OP_FUNCTION if first_fn == words.len() => first_fn = i,
            OP_VARIABLE | OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN
                if wg_types.contains(&w[1]) =>
            {
                wg.insert(w[2]);
            }
            _ => {}
        }
    }
    if !vulkan {
        return (words.to_vec(), 0);
    }
    let uint = uint.expect("naga declares u32 in any module with barriers or coop strides");
    let mut out = words[..5].to_vec();
    let scope = match consts
        .iter()
        .find(|&&(t, _, v)| t == uint && v == SCOPE_WORKGROUP)
    {
        Some(&(_, id, _)) => id,
        None => {
            let id = out[3];
            out[3] += 1; // bound
            id
        }
    };
    let mut changed = 0;
    for &(i, n, op) in &list {
        if i == first_fn && !consts.iter().any(|&(_, id, _)| id == scope) {
            out.extend([(4 << 16) | OP_CONSTANT, uint, scope, SCOPE_WORKGROUP]);
        }
        let w = &words[i..i + n];
        let extra = match (op, n) {
            (OP_LOAD, 4) if wg.contains(&w[3]) => Some(VISIBLE),
            (OP_STORE, 3) if wg.contains(&w[1]) => Some(AVAILABLE),
            (OP_COOP_LOAD, 6) if wg.contains(&w[3]) => Some(VISIBLE),
            (OP_COOP_STORE, 5) if wg.contains(&w[1]) => Some(AVAILABLE),
            _ => None,
        };
        match extra {
            Some(bits) => {
                out.push((((n + 2) as u32) << 16) | op);
                out.extend_from_slice(&w[1..]);
                out.extend([bits, scope]);
                changed += 1;
            }
            None => out.extend_from_slice(w),
        }
    }
    (out, changed)
}
