//! Duration literals: `"500ms"`, `"5s"`, `"2m"`, `"1h"`, read when the macro expands.

/// The milliseconds a duration literal names, or why it names none.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let unit_millis: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => 0,
    };
    if digits.is_empty() || unit_millis == 0 {
        return Err(format!(
            "{text:?} is not a whole number followed by a unit; write it as \"500ms\", \"5s\", \"2m\" or \"1h\""
        ));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(unit_millis))
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn units() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("5s"), Ok(5_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "5",
            "s",
            "5 s",
            "5sec",
            "1.5s",
            "-1s",
            "5S",
            "99999999999999999999h",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }
}
