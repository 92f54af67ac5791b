// Shared by every kernel: the host prepends this file (after the constants and element-type
// aliases, before the generated `struct Params`), so each helper is written once.

// A score masked out, and where a running max starts: exp(NEG − m) and exp2(NEG − m) are
// exactly 0 for every m ≥ FLOOR, and never NaN (unlike −∞ − −∞).
const NEG: f32 = -3.0e38;
const FLOOR: f32 = -1.0e38;
// The log-sum-exp a fused forward saves for a row with nothing to attend to: exp2(s − LSE_EMPTY)
// is exactly 0 for every score s, so such a row gets zero probabilities in the backward pass.
const LSE_EMPTY: f32 = 3.0e38;
// Scores in the log2 domain (exp2 instead of exp) are the natural-log ones times LOG2E.
const LOG2E: f32 = 1.4426950408889634;

// Index of a mask's element for (batch b, head h, query i, key j), through its element
// strides `s` over those four axes (0 along broadcast axes, so a broadcast mask is never
// expanded in memory).
fn mask_offset(s: vec4<u32>, b: u32, h: u32, i: u32, j: u32) -> u32 {
    return b * s.x + h * s.y + i * s.z + j * s.w;
}

// Score `x` with a mask's `bias` added in units of `unit` (1.0 for natural-log scores, LOG2E
// in the log2 domain); NEG where the bias marks the key masked out (the host stores f32::MIN
// there, and clamps finite biases to -1e37).
fn add_bias(x: f32, bias: f32, unit: f32) -> f32 {
    return select(x + bias * unit, NEG, bias < FLOOR);
}
