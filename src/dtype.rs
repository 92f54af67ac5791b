//! The element type operands are stored in on the device: a leaf, below the `error` module
//! (whose `Overflow` names it) and every layer that stores or checks operands.

/// The element type the operands are stored in on the device.
///
/// With [`Dtype::F16`] (needs `Features::SHADER_F16`), X, the projection weights and biases
/// (or Q, K, V given with [`crate::Inputs::qkv`]) are rounded to f16 and uploaded as f16, and the
/// projected Q, K, V are stored as f16: half the memory and bandwidth. Every product, softmax
/// and sum is computed and accumulated in f32, and the context and weights come back as f32.
/// Inputs beyond f16's range (±65,504) are an error, as is a result that overflowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dtype {
    /// float32 everywhere.
    #[default]
    F32,
    /// float16 operands, float32 arithmetic.
    F16,
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        })
    }
}
