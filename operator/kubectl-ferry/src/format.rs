//! Figures as people read them: byte counts, rates, ages, durations and a progress bar.

use std::time::Duration;

pub use ferry_api::human::{human_duration, human_rate};

/// "0 B", "512 B", "1.5 KiB", "24.6 MiB", "2.8 GiB" (binary units, one decimal).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// An age as kubectl prints it: "45s", "5m10s", "42m", "3h5m", "20h", "3d4h", "90d", "2y10d".
/// A negative age (clock skew) of more than a second is "<invalid>".
pub fn human_age(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let s = seconds.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let minutes = s / 60;
    if minutes < 10 {
        return match s % 60 {
            0 => format!("{minutes}m"),
            rest => format!("{minutes}m{rest}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = s / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            rest => format!("{hours}h{rest}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            rest => format!("{days}d{rest}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            rest => format!("{years}y{rest}d"),
        };
    }
    format!("{years}y")
}

/// Parses "90", "90s", "5m", "1h30m", "1h2m3s" (a plain number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".to_owned());
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    let mut last_unit = u64::MAX;
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {c:?} (use h, m, s)"
                ));
            }
        };
        if number.is_empty() || unit >= last_unit {
            return Err(format!(
                "invalid duration {text:?} (expected e.g. 90s, 5m, 1h30m)"
            ));
        }
        let n: u64 = number
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("invalid duration {text:?}: too long"))?;
        number.clear();
        last_unit = unit;
    }
    if !number.is_empty() {
        return Err(format!(
            "invalid duration {text:?}: a number without a unit at the end"
        ));
    }
    Ok(Duration::from_secs(total))
}

/// `[=========>          ]`: `width` cells between the brackets for 0-100 percent.
pub fn progress_bar(percent: u32, width: usize) -> String {
    let percent = percent.min(100) as usize;
    let filled = percent * width / 100;
    let mut bar = String::with_capacity(width + 2);
    bar.push('[');
    for i in 0..width {
        bar.push(if i + 1 < filled || (i + 1 == filled && filled == width) {
            '='
        } else if i + 1 == filled {
            '>'
        } else {
            ' '
        });
    }
    bar.push(']');
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units_with_one_decimal() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (24 << 20, "24.0 MiB"),
            ((5 << 30) / 2, "2.5 GiB"),
            (3 << 40, "3.0 TiB"),
            (u64::MAX, "16384.0 PiB"),
        ];
        for (n, want) in cases {
            assert_eq!(human_bytes(n), want, "{n}");
        }
    }

    #[test]
    fn rates_and_etas_reuse_the_status_format() {
        assert_eq!(human_rate(0), "0 B/s");
        assert_eq!(human_rate(4 << 20), "4.0 MiB/s");
        assert_eq!(human_rate(1536), "1.5 KiB/s");
        assert_eq!(human_duration(3723), "1h2m3s");
        assert_eq!(human_duration(6), "6s");
    }

    #[test]
    fn ages_follow_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (310, "5m10s"),
            (42 * 60, "42m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (4 * 3600, "4h"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (5 * 86400, "5d"),
            (90 * 86400, "90d"),
            (2 * 365 * 86400 + 10 * 86400, "2y10d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (s, want) in cases {
            assert_eq!(human_age(s), want, "{s}");
        }
    }

    #[test]
    fn durations_parse_like_kubectl_timeouts() {
        let ok = [
            ("90", 90),
            ("90s", 90),
            ("5m", 300),
            ("1h30m", 5400),
            ("1h2m3s", 3723),
            ("0s", 0),
        ];
        for (text, secs) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(secs)),
                "{text}"
            );
        }
        for bad in ["", "5x", "m", "1s1m", "5m5m", "10m5", "-5s", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn progress_bar_fills_with_the_percentage() {
        assert_eq!(progress_bar(0, 10), "[          ]");
        assert_eq!(progress_bar(5, 10), "[          ]");
        assert_eq!(progress_bar(10, 10), "[>         ]");
        assert_eq!(progress_bar(42, 10), "[===>      ]");
        assert_eq!(progress_bar(99, 10), "[========> ]");
        assert_eq!(progress_bar(100, 10), "[==========]");
        assert_eq!(progress_bar(250, 10), "[==========]");
        assert_eq!(progress_bar(50, 0), "[]");
    }
}
