//! Value parsers for the numeric and named options, so that a bad value is a usage error
//! (exit status 2) that says what the option takes.

/// A count: a whole number, 0 or more.
pub fn count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| "expected a whole number, 0 or more".into())
}

/// A count of at least 1.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match count(s) {
        Ok(0) | Err(_) => Err("expected a whole number, 1 or more".into()),
        Ok(n) => Ok(n),
    }
}

/// Seconds (or any quantity): a finite number, 0 or more.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("expected a number, 0 or more".into()),
    }
}

/// A random seed: a whole number from 0 to 2⁶⁴ − 1.
pub fn seed(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| "expected a whole number from 0 to 18446744073709551615".into())
}

/// `bench --kernels`: a kernel family, or `all`.
pub fn family_or_all(s: &str) -> Result<String, String> {
    let s = s.trim().to_ascii_lowercase();
    if s == "all" {
        return Ok(s);
    }
    s.parse::<wgpu_attention::Kernels>()
        .map(|_| s)
        .map_err(|_| "expected auto, storage, subgroup or all (or coop: tensor cores)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_families_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(count("0"), Ok(0));
        assert!(count("-1").unwrap_err().contains("0 or more"));
        assert_eq!(at_least_one(" 3"), Ok(3));
        assert!(at_least_one("0").unwrap_err().contains("1 or more"));
        assert_eq!(seed("7"), Ok(7));
        assert!(seed("x").is_err());
        assert_eq!(family_or_all("ALL").as_deref(), Ok("all"));
        assert_eq!(family_or_all("storage").as_deref(), Ok("storage"));
        assert!(family_or_all("fast")
            .unwrap_err()
            .contains("subgroup or all"));
    }
}
