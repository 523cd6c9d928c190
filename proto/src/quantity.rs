//! Byte quantities as Kubernetes writes them (`50M`, `1Gi`, `1.5k`): one syntax for the mover's
//! `--bandwidth-limit` and the Transfer's `bandwidthLimit`, so a value means the same in both.

/// A Kubernetes quantity as a whole number of bytes: decimal suffixes `k M G T P` (powers of
/// 1000), binary `Ki Mi Gi Ti Pi` (powers of 1024), or none; a decimal point is allowed
/// (`1.5k` = 1500). Anything else (`m`, `E`, exponents, signs) is `None`.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let bytes = (v * mult).round();
    (bytes.is_finite() && (0.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

/// A `--bandwidth-limit` value: bytes per second as a quantity; `0` means no limit.
pub fn bandwidth_limit(s: &str) -> Result<u64, String> {
    parse_quantity(s).ok_or_else(|| {
        format!(
            "{s:?} is not a quantity of bytes per second (50M = 50 000 000, 1Gi = 1 073 741 824, 0 = no limit)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_suffixes() {
        assert_eq!(parse_quantity("10M"), Some(10_000_000));
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("1.5k"), Some(1500));
        assert_eq!(parse_quantity("12"), Some(12));
        assert_eq!(parse_quantity(" 2Ki "), Some(2048));
    }

    #[test]
    fn everything_else_is_refused() {
        for bad in [
            "",
            "M",
            "1X",
            "1m",
            "1E",
            "1Ei",
            "-1",
            "1e3",
            "1..2k",
            "99999999P",
        ] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bandwidth_limit_parses_quantities_and_explains_refusals() {
        assert_eq!(bandwidth_limit("0"), Ok(0));
        assert_eq!(bandwidth_limit("20M"), Ok(20_000_000));
        assert!(
            bandwidth_limit("fast")
                .unwrap_err()
                .contains("not a quantity")
        );
    }
}
