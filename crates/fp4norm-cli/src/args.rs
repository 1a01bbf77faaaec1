//! Value parsers of the numeric options. The options take values that start with '-'
//! (clap's `allow_negative_numbers` on integers, `allow_hyphen_values` on floats, where
//! `-inf` and `-1e-3` are not plain numbers to clap), so that a negative or non-finite
//! value gets the option's own message instead of "unexpected argument '-1'".

use std::fmt::Display;
use std::str::FromStr;

/// An unsigned integer of type `T` (`T::MAX` is `max`), else `{what}` must be a positive
/// integer (or, with `zero_ok`, an integer >= 0), with the largest value when too large.
fn unsigned<T: FromStr>(
    text: &str,
    what: &str,
    zero_ok: bool,
    max: impl Display,
) -> Result<T, String> {
    if let Ok(v) = text.parse() {
        return Ok(v);
    }
    let wanted = if zero_ok {
        "an integer >= 0"
    } else {
        "a positive integer"
    };
    let sep = if what.is_empty() { "" } else { " " };
    let digits = text.strip_prefix('+').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        Err(format!("{what}{sep}must be {wanted} of at most {max}"))
    } else {
        Err(format!("{what}{sep}must be {wanted}"))
    }
}

/// `--m`: M, a row count (0 is left to the usage checks, which say why).
pub fn rows(text: &str) -> Result<usize, String> {
    unsigned(text, "M", false, usize::MAX)
}

/// `--h`: H, a hidden size (0 is left to the usage checks, which say why).
pub fn hidden(text: &str) -> Result<usize, String> {
    unsigned(text, "H", false, usize::MAX)
}

/// A count that must be at least 1 (0 is left to the usage checks, which say why).
pub fn count(text: &str) -> Result<usize, String> {
    unsigned(text, "", false, usize::MAX)
}

/// A count or index that may be 0.
pub fn count0(text: &str) -> Result<usize, String> {
    unsigned(text, "", true, usize::MAX)
}

/// A seed.
pub fn seed(text: &str) -> Result<u64, String> {
    unsigned(text, "", true, u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_say_what_is_wanted() {
        assert_eq!(rows("16"), Ok(16));
        assert_eq!(rows("0"), Ok(0));
        assert_eq!(rows("+3"), Ok(3));
        assert_eq!(rows("-1"), Err("M must be a positive integer".into()));
        assert_eq!(hidden("1.5"), Err("H must be a positive integer".into()));
        assert_eq!(
            rows("99999999999999999999999"),
            Err(format!(
                "M must be a positive integer of at most {}",
                usize::MAX
            ))
        );
        assert_eq!(count("-2"), Err("must be a positive integer".into()));
        assert_eq!(count0("x"), Err("must be an integer >= 0".into()));
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(seed("-1"), Err("must be an integer >= 0".into()));
    }
}
