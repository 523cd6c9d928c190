//! Compiles arbitrary filter rules as a receiver gets them over the wire (`Filter::from_wire`)
//! and matches arbitrary paths against them under a small budget. Must never panic; the rules
//! round-trip through `to_wire`; once the budget is spent every entry is kept from deletion
//! (reported as excluded) and matching costs nothing more.
#![no_main]

use ferry_mover::tree::filter::Filter;
use libfuzzer_sys::fuzz_target;

const BUDGET: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    // Lines before the first empty line are rules, the rest are paths to match.
    let text = String::from_utf8_lossy(data);
    let (rules, paths) = text.split_once("\n\n").unwrap_or((&text, ""));
    let rules: Vec<String> = rules.lines().map(str::to_owned).collect();
    let Ok(filter) = Filter::from_wire(&rules) else {
        return;
    };
    assert_eq!(Filter::from_wire(&filter.to_wire()).map(|f| f.to_wire()).ok(), Some(filter.to_wire()));
    let filter = filter.with_budget(BUDGET);
    for (i, path) in paths.lines().enumerate() {
        let before = filter.work();
        let excluded = filter.excludes(path.as_bytes(), i % 2 == 0);
        if before > BUDGET {
            assert!(excluded, "a spent budget keeps every entry from deletion");
            assert_eq!(filter.work(), before, "a spent budget costs nothing more");
        }
    }
});
