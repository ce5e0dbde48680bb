//! Humane durations: `30s`, `1m30s`, `500ms`, `2h`, `1.5s`.
//!
//! A small parser of our own rather than a crate: the grammar is five units, the error says
//! exactly what was wrong, and every overflow is an error rather than a wrap or a panic (a
//! `u64` of milliseconds bounds every duration at about 584 million years, and the lock itself
//! checks that a TTL fits Redis).

use std::time::Duration;

/// Parses one or more `<number><unit>` parts, summed: units `ms`, `s`, `m`, `h`, `d`; a number
/// may have a fraction (`1.5s`). `0s` is zero. A bare number is refused (is `30` seconds or
/// milliseconds?).
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration: write e.g. 30s, 1m30s or 500ms".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(format!(
                "{text:?}: expected a number at {after:?} (write e.g. 30s, 1m30s or 500ms)"
            ));
        }
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => {
                return Err(format!(
                    "{text:?}: {number} needs a unit: ms, s, m, h or d (e.g. {number}s)"
                ))
            }
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?}: use ms, s, m, h or d"
                ))
            }
        };
        let part = scaled(number, nanos_per_unit)
            .ok_or_else(|| format!("{text:?}: {number}{unit} is not a valid amount"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = next;
    }
    // Bounded so that any later arithmetic in milliseconds fits a u64.
    if total.as_millis() > u128::from(u64::MAX) {
        return Err(format!("{text:?} is too long"));
    }
    Ok(total)
}

/// `number` (digits with at most one `.`) times `unit` nanoseconds, if it fits.
fn scaled(number: &str, unit: u128) -> Option<Duration> {
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(unit)?;
    // The fraction, digit by digit, to nanosecond precision (extra digits are dropped).
    let mut scale = unit;
    for digit in frac.chars() {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(digit.to_digit(10)?) * scale)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// A duration for people: `1m30s`, `2.5s`, `450ms`.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, s) {
        (0, 0) => format!("{m}m"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn humane_forms() {
        assert_eq!(parse("30s"), Ok(ms(30_000)));
        assert_eq!(parse("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse("500ms"), Ok(ms(500)));
        assert_eq!(parse("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse(".5s"), Ok(ms(500)));
        assert_eq!(parse("1h1m1s1ms"), Ok(ms(3_661_001)));
        assert_eq!(parse(" 10s "), Ok(ms(10_000)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1.0000000001s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        for (bad, says) in [
            ("", "empty"),
            ("30", "needs a unit"),
            ("10x", "unknown unit"),
            ("s", "expected a number"),
            ("1..5s", "not a valid amount"),
            (".s", "not a valid amount"),
            ("-1s", "expected a number"),
            ("1 s", "needs a unit"),
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert!(parse("99999999999999999999999999999999999999999d").is_err());
        assert!(parse("18446744073709551615s").is_err());
        assert!(parse("300000000000d").is_err());
        // The largest that fits is accepted.
        assert!(parse("18446744073709551ms").is_ok());
    }

    #[test]
    fn shown_for_people() {
        assert_eq!(show(ms(450)), "450ms");
        assert_eq!(show(ms(2_500)), "2.5s");
        assert_eq!(show(ms(90_000)), "1m30s");
        assert_eq!(show(ms(120_000)), "2m");
        assert_eq!(show(ms(3_723_000)), "1h2m3s");
    }
}
