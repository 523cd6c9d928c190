//! Cron expressions as Kubernetes CronJob reads them (five fields: minute, hour, day of month,
//! month, day of week; `*`, `?`, `a`, `a-b`, `*/n`, `a-b/n`, `a/n`, lists, month and weekday
//! names, and the macros `@yearly` to `@hourly`), and the next time one fires in a time zone.
//!
//! Day of month and day of week combine as cron always has: when both are restricted, a day
//! matching either fires; when one is `*` (or `?`, without a step), only the other counts.
//!
//! Daylight saving: a wall-clock time the zone skips (spring forward) does not fire; one it
//! repeats (fall back) fires once, at its first occurrence.
//!
//! Kept by hand rather than taken from a crate: the maintained ones read a larger language than
//! CronJob (croner and cron accept seconds, `L`, `W` and `#`, which a CronJob refuses, so a
//! schedule could be valid here and not there) and run on chrono with its own time zone
//! database beside the jiff one the operator already carries. CronJob's grammar is small and
//! fixed; the tests below pin it.

use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// Day of month or day of week was `*`: the days are the other field's alone.
    any_day_of_month: bool,
    any_day_of_week: bool,
}

/// How far ahead [`Cron::next_after`] looks before it says "never" (a schedule such as
/// `0 0 30 2 *`, February 30th).
const HORIZON_YEARS: i16 = 8;

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
/// 0 and 7 are both Sunday.
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Cron {
    /// Parses `expr`, with a message that names the field at fault.
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let expr = expr.trim();
        let expanded = match expr {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            _ if expr.starts_with('@') => {
                return Err(format!(
                    "unknown macro {expr:?} (use @yearly, @monthly, @weekly, @daily or @hourly)"
                ));
            }
            _ => expr,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "{expr:?} has {} fields; a schedule has five: minute hour day-of-month month day-of-week",
                fields.len()
            ));
        }
        let (minutes, _) = parse_field(fields[0], &MINUTE)?;
        let (hours, _) = parse_field(fields[1], &HOUR)?;
        let (days_of_month, any_day_of_month) = parse_field(fields[2], &DAY_OF_MONTH)?;
        let (months, _) = parse_field(fields[3], &MONTH)?;
        let (mut days_of_week, any_day_of_week) = parse_field(fields[4], &DAY_OF_WEEK)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week | 1) & !(1 << 7);
        }
        Ok(Cron {
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week,
            any_day_of_month,
            any_day_of_week,
        })
    }

    /// The first time after `after` (strictly) that the expression fires in `tz`, or `None` when
    /// it does not fire within the next years (a date that never comes, such as February 30th).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = tz.to_datetime(after);
        let horizon = start.year().saturating_add(HORIZON_YEARS);
        // The next whole minute of the wall clock.
        let mut dt = start
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(jiff::SignedDuration::from_secs(60))
            .ok()?;
        while dt.year() <= horizon {
            if !bit(self.months, dt.month()) {
                dt = first_of_next_month(dt.date())?;
                continue;
            }
            if !self.day_matches(dt.date()) {
                dt = dt
                    .date()
                    .tomorrow()
                    .ok()?
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !bit(self.hours, dt.hour()) {
                dt = next_hour(dt)?;
                continue;
            }
            if !bit(self.minutes, dt.minute()) {
                dt = dt.checked_add(jiff::SignedDuration::from_secs(60)).ok()?;
                continue;
            }
            let at = match tz.to_ambiguous_timestamp(dt).offset() {
                AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok(),
                // Skipped by the zone: this wall-clock time does not happen.
                AmbiguousOffset::Gap { .. } => None,
                // Repeated: the first occurrence (the later one is then in the past).
                AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok(),
            };
            match at {
                Some(at) if at > after => return Some(at),
                _ => dt = dt.checked_add(jiff::SignedDuration::from_secs(60)).ok()?,
            }
        }
        None
    }

    fn day_matches(&self, date: Date) -> bool {
        let dom = bit(self.days_of_month, date.day());
        let dow = bit(self.days_of_week, date.weekday().to_sunday_zero_offset());
        if self.any_day_of_month || self.any_day_of_week {
            dom && dow
        } else {
            dom || dow
        }
    }
}

fn bit(set: u64, value: i8) -> bool {
    (0..64).contains(&value) && set & (1 << value) != 0
}

fn first_of_next_month(date: Date) -> Option<DateTime> {
    let next = date.last_of_month().tomorrow().ok()?;
    Some(next.to_datetime(jiff::civil::Time::midnight()))
}

fn next_hour(dt: DateTime) -> Option<DateTime> {
    dt.with()
        .minute(0)
        .build()
        .ok()?
        .checked_add(jiff::SignedDuration::from_hours(1))
        .ok()
}

/// One field: a bit per allowed value, and whether it was `*` (or `?`) without a step.
fn parse_field(text: &str, field: &Field) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    let mut any = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    format!(
                        "{}: step {s:?} in {part:?} is not a positive number",
                        field.name
                    )
                })?;
                (r, Some(step))
            }
            None => (part, None),
        };
        let (lo, hi, star) = if range == "*" || range == "?" {
            (field.min, field.max, true)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, field)?, value(b, field)?, false)
        } else {
            let v = value(range, field)?;
            // `a/n` runs from a to the field's end.
            (v, if step.is_some() { field.max } else { v }, false)
        };
        if lo > hi {
            return Err(format!(
                "{}: range {part:?} runs backwards ({lo} > {hi})",
                field.name
            ));
        }
        let step = step.unwrap_or(1);
        any |= star && step == 1;
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            v += step;
        }
    }
    Ok((set, any))
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|n| *n == lower) {
        // Months count from 1, weekdays from 0: names start at the field's lowest value.
        return Ok(i as u32 + field.min);
    }
    let v: u32 = text.parse().map_err(|_| {
        format!(
            "{}: {text:?} is not a number{}",
            field.name,
            names_hint(field)
        )
    })?;
    if !(field.min..=field.max).contains(&v) {
        return Err(format!(
            "{}: {v} is out of range {}-{}",
            field.name, field.min, field.max
        ));
    }
    Ok(v)
}

fn names_hint(field: &Field) -> String {
    match field.names.first() {
        Some(first) => format!(" or a name ({first}, ...)"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(expr: &str, after: &str, tz: &str) -> Option<String> {
        let tz = TimeZone::get(tz).unwrap();
        Cron::parse(expr)
            .unwrap()
            .next_after(ts(after), &tz)
            .map(|t| t.to_string())
    }

    #[test]
    fn every_minute_fires_at_the_next_whole_minute() {
        assert_eq!(
            next("* * * * *", "2026-11-27T10:00:30Z", "UTC").as_deref(),
            Some("2026-11-27T10:01:00Z")
        );
        // Strictly after: a time that is itself a firing gives the next one.
        assert_eq!(
            next("* * * * *", "2026-11-27T10:01:00Z", "UTC").as_deref(),
            Some("2026-11-27T10:02:00Z")
        );
    }

    #[test]
    fn steps_ranges_lists_and_names() {
        assert_eq!(
            next("*/15 * * * *", "2026-11-27T10:16:00Z", "UTC").as_deref(),
            Some("2026-11-27T10:30:00Z")
        );
        assert_eq!(
            next("5/20 * * * *", "2026-11-27T10:26:00Z", "UTC").as_deref(),
            Some("2026-11-27T10:45:00Z")
        );
        assert_eq!(
            next("0 9-17/4 * * *", "2026-11-27T13:00:00Z", "UTC").as_deref(),
            Some("2026-11-27T17:00:00Z")
        );
        // 2026-11-27 is a Friday: the next Monday or Wednesday at 02:30.
        assert_eq!(
            next("30 2 * * mon,WED", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2026-11-30T02:30:00Z")
        );
        assert_eq!(
            next("0 0 1 jan-mar *", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2027-01-01T00:00:00Z")
        );
        // 7 is Sunday too.
        assert_eq!(
            next("0 0 * * 7", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2026-11-29T00:00:00Z")
        );
    }

    #[test]
    fn macros_expand_to_their_fields() {
        assert_eq!(Cron::parse("@daily"), Cron::parse("0 0 * * *"));
        assert_eq!(Cron::parse("@midnight"), Cron::parse("0 0 * * *"));
        assert_eq!(Cron::parse("@annually"), Cron::parse("0 0 1 1 *"));
        assert_eq!(
            next("@hourly", "2026-11-27T10:00:00Z", "UTC").as_deref(),
            Some("2026-11-27T11:00:00Z")
        );
        assert_eq!(
            next("@weekly", "2026-11-27T10:00:00Z", "UTC").as_deref(),
            Some("2026-11-29T00:00:00Z")
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_restricted_together_fire_on_either() {
        // The 1st, or any Monday: Monday 2026-11-30 comes before December 1st.
        assert_eq!(
            next("0 0 1 * 1", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2026-11-30T00:00:00Z")
        );
        // With day of week `*`, only the day of month counts.
        assert_eq!(
            next("0 0 1 * *", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2026-12-01T00:00:00Z")
        );
        // A stepped star restricts: every other day of month (odd days) or Monday.
        assert_eq!(
            next("0 0 */2 * 1", "2026-11-28T01:00:00Z", "UTC").as_deref(),
            Some("2026-11-29T00:00:00Z")
        );
    }

    #[test]
    fn the_time_zone_places_the_wall_clock() {
        assert_eq!(
            next("0 2 * * *", "2026-11-27T00:00:00Z", "Europe/Berlin").as_deref(),
            Some("2026-11-27T01:00:00Z")
        );
        assert_eq!(
            next("0 2 * * *", "2026-07-01T00:00:00Z", "America/New_York").as_deref(),
            Some("2026-07-01T06:00:00Z")
        );
    }

    #[test]
    fn a_skipped_wall_clock_time_does_not_fire_and_a_repeated_one_fires_once() {
        // Berlin skips 02:00-03:00 on 2026-03-29: 02:30 that day never happens.
        assert_eq!(
            next("30 2 * * *", "2026-03-28T12:00:00Z", "Europe/Berlin").as_deref(),
            Some("2026-03-30T00:30:00Z")
        );
        // Berlin repeats 02:00-03:00 on 2026-10-25: 02:30 fires at its first occurrence (CEST),
        // and the next firing after it is the following day, not the repeat.
        let first = next("30 2 * * *", "2026-10-24T12:00:00Z", "Europe/Berlin").unwrap();
        assert_eq!(first, "2026-10-25T00:30:00Z");
        assert_eq!(
            next("30 2 * * *", &first, "Europe/Berlin").as_deref(),
            Some("2026-10-26T01:30:00Z")
        );
    }

    #[test]
    fn a_date_that_never_comes_is_never() {
        assert_eq!(next("0 0 30 2 *", "2026-11-27T00:00:00Z", "UTC"), None);
        // February 29th comes in leap years.
        assert_eq!(
            next("0 0 29 2 *", "2026-11-27T00:00:00Z", "UTC").as_deref(),
            Some("2028-02-29T00:00:00Z")
        );
    }

    #[test]
    fn bad_expressions_say_which_field_is_wrong() {
        let err = |e: &str| Cron::parse(e).unwrap_err();
        assert!(
            err("* * * *").contains("has 4 fields"),
            "{}",
            err("* * * *")
        );
        assert!(err("61 * * * *").contains("minute: 61 is out of range 0-59"));
        assert!(err("* 24 * * *").contains("hour: 24 is out of range"));
        assert!(err("* * 0 * *").contains("day of month: 0 is out of range 1-31"));
        assert!(err("* * * 13 *").contains("month: 13"));
        assert!(err("* * * * 8").contains("day of week: 8"));
        assert!(err("*/0 * * * *").contains("not a positive number"));
        assert!(err("5-1 * * * *").contains("runs backwards"));
        assert!(err("* * * foo *").contains("month: \"foo\" is not a number or a name (jan"));
        assert!(err("@every 5m").contains("unknown macro"));
        assert!(err("").contains("has 0 fields"));
    }
}
