//! Sizes in durun.toml: a number of bytes, or a string such as `"64MiB"`
//! (`[proxy] max_record`, `[mcp] max_message`).

/// A size in a config: a number of bytes, or a string like `"64MiB"`.
pub(super) fn size_value(value: &toml::Value) -> Option<usize> {
    match value {
        toml::Value::Integer(bytes) => usize::try_from(*bytes).ok().filter(|n| *n > 0),
        toml::Value::String(text) => size(text),
        _ => None,
    }
}

/// A size like `"64MiB"`, `"512KiB"`, `"1GiB"` or `"1000"` (bytes).
fn size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |at| text.split_at(at));
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number
        .parse::<usize>()
        .ok()?
        .checked_mul(unit)
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_bytes_or_a_number_and_a_binary_unit() {
        assert_eq!(size("1000"), Some(1000));
        assert_eq!(size("64MiB"), Some(64 << 20));
        assert_eq!(size(" 512 KiB "), Some(512 << 10));
        assert_eq!(size("1GiB"), Some(1 << 30));
        for wrong in ["", "0", "64MB", "MiB", "-1", "99999999999999999999GiB"] {
            assert_eq!(size(wrong), None, "{wrong:?}");
        }
        assert_eq!(size_value(&toml::Value::Integer(7)), Some(7));
        assert_eq!(size_value(&toml::Value::Integer(-7)), None);
        assert_eq!(size_value(&toml::Value::Boolean(true)), None);
    }
}
