//! Syntax check for disruption-budget schedules: standard five-field cron or an `@` descriptor.
//!
//! Karpenter parses budget schedules with a standard cron parser (UTC, no seconds field) and treats
//! an invalid one as a budget of zero. Rejecting it up front tells the user why instead.

/// Checks `schedule`; the error names the offending field.
pub fn check_schedule(schedule: &str) -> Result<(), String> {
    if let Some(descriptor) = schedule.strip_prefix('@') {
        const DESCRIPTORS: &[&str] = &[
            "annually", "yearly", "monthly", "weekly", "daily", "midnight", "hourly",
        ];
        return if DESCRIPTORS.contains(&descriptor) {
            Ok(())
        } else {
            Err(format!(
                "unknown descriptor @{descriptor} (use one of @{})",
                DESCRIPTORS.join(", @")
            ))
        };
    }
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week), got {}",
            fields.len()
        ));
    }
    const MONTHS: &[&str] = &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    const DAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
    let specs: [(&str, u32, u32, &[&str]); 5] = [
        ("minute", 0, 59, &[]),
        ("hour", 0, 23, &[]),
        ("day-of-month", 1, 31, &[]),
        ("month", 1, 12, MONTHS),
        ("day-of-week", 0, 6, DAYS),
    ];
    for (field, (name, min, max, names)) in fields.iter().zip(specs) {
        check_field(field, min, max, names).map_err(|e| format!("{name} field {field:?}: {e}"))?;
    }
    Ok(())
}

fn check_field(field: &str, min: u32, max: u32, names: &[&str]) -> Result<(), String> {
    let value = |text: &str| -> Result<u32, String> {
        let lower = text.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            // Month names start at 1, day names at 0.
            return Ok(i as u32 + min);
        }
        let n: u32 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
        if n < min || n > max {
            Err(format!("{n} is outside {min}-{max}"))
        } else {
            Ok(n)
        }
    };
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (part, None),
        };
        if let Some(step) = step {
            let step: u32 = step
                .parse()
                .map_err(|_| format!("step {step:?} is not a number"))?;
            if step == 0 {
                return Err("step must be positive".into());
            }
        }
        match range {
            "*" | "?" => {}
            _ => {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (value(lo)?, value(hi)?),
                    None => (value(range)?, value(range)?),
                };
                if lo > hi {
                    return Err(format!("range {range:?} is backwards"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_schedule;

    #[test]
    fn accepts_standard_cron_and_descriptors() {
        for ok in [
            "@daily",
            "0 9 * * mon-fri",
            "*/15 0-6 1,15 jan-jun 0",
            "30 22 * * SAT",
        ] {
            assert_eq!(check_schedule(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_with_the_field_named() {
        assert!(check_schedule("@sometimes").is_err());
        assert!(check_schedule("0 9 * *").is_err_and(|e| e.contains("5 fields")));
        assert!(check_schedule("61 9 * * *").is_err_and(|e| e.contains("minute")));
        assert!(check_schedule("0 9 * * funday").is_err_and(|e| e.contains("day-of-week")));
        assert!(check_schedule("*/0 * * * *").is_err());
    }
}
