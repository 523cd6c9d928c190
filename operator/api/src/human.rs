//! Rates and durations as people read them, in the status and in the plugin's tables.

/// "48.0 MiB/s".
pub fn human_rate(bytes_per_second: u64) -> String {
    let v = bytes_per_second as f64;
    let units = [
        ("GiB/s", 1u64 << 30),
        ("MiB/s", 1 << 20),
        ("KiB/s", 1 << 10),
    ];
    for (unit, size) in units {
        if bytes_per_second >= size {
            return format!("{:.1} {unit}", v / size as f64);
        }
    }
    format!("{bytes_per_second} B/s")
}

/// "1h2m3s", "4m5s", "6s".
pub fn human_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}
