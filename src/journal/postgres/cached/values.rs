//! Values written as constants into a batch of statements (the simple
//! query protocol takes no parameters).

use crate::journal::tx::Arg;

/// Writes the arguments of an `EXECUTE` of a statement prepared by name
/// onto `out`: `(v1, v2)` as constants, or nothing for none; `None` for a
/// value it does not write (a text with a NUL, which PostgreSQL does not
/// hold), which then runs as a prepared statement of the protocol, and
/// `out` is the caller's to truncate.
///
/// A text is dollar-quoted with a tag that does not occur in it, so that
/// it reads back byte for byte whatever it holds and whatever the
/// server's `standard_conforming_strings`.
pub(super) fn write_values(out: &mut String, args: &[Arg<'_>]) -> Option<()> {
    for (n, arg) in args.iter().enumerate() {
        out.push(if n == 0 { '(' } else { ',' });
        write_value(out, arg)?;
    }
    if !args.is_empty() {
        out.push(')');
    }
    Some(())
}

/// One parameter's value as a constant, spaced from what is around it.
fn write_value(out: &mut String, arg: &Arg<'_>) -> Option<()> {
    use std::fmt::Write as _;
    match *arg {
        Arg::Null => out.push_str(" NULL "),
        Arg::Int(value) if value < 0 => write!(out, " ({value}) ").ok()?,
        Arg::Int(value) => write!(out, " {value} ").ok()?,
        Arg::Text(text) => write_text(out, text)?,
        Arg::Texts(list) => {
            out.push_str(" (ARRAY[");
            for (n, text) in list.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_text(out, text)?;
            }
            out.push_str("]::TEXT[]) ");
        }
    }
    Some(())
}

/// A text, dollar-quoted with a tag that first occurs where it closes the
/// text; `None` for a text with a NUL, which PostgreSQL does not hold.
fn write_text(out: &mut String, text: &str) -> Option<()> {
    use std::fmt::Write as _;
    if text.contains('\0') {
        return None;
    }
    let mut tag = String::from("$d$");
    let mut n = 0;
    // A tag's only border is its `$`: it closes the text early if the
    // text holds it, or ends in it without its last `$`.
    while text.contains(tag.as_str()) || text.ends_with(&tag[..tag.len() - 1]) {
        n += 1;
        tag = format!("$d{n}$");
    }
    write!(out, " {tag}{text}{tag} ").ok()
}

#[cfg(test)]
mod tests {
    use super::write_values;
    use crate::journal::tx::Arg;

    /// The values as the tests read them: `write_values` onto nothing.
    fn values_of(args: &[Arg<'_>]) -> Option<String> {
        let mut out = String::new();
        write_values(&mut out, args)?;
        Some(out)
    }

    #[test]
    fn values_are_written_as_constants() {
        let args: Vec<Arg<'_>> = vec![Arg::Int(1), Arg::Int(-7), Arg::Null, Arg::Text("it's")];
        assert_eq!(
            values_of(&args).as_deref(),
            Some("( 1 , (-7) , NULL , $d$it's$d$ )")
        );
        assert_eq!(values_of(&[]).as_deref(), Some(""));
        assert_eq!(
            values_of(&[Arg::Text("a$d")]).as_deref(),
            Some("( $d1$a$d$d1$ )"),
            "a tag that would close early is not used"
        );
        let list = ["a".to_owned(), "b'".to_owned()];
        assert_eq!(
            values_of(&[Arg::Texts(&list)]).as_deref(),
            Some("( (ARRAY[ $d$a$d$ , $d$b'$d$ ]::TEXT[]) )")
        );
        assert_eq!(
            values_of(&[Arg::Texts(&[])]).as_deref(),
            Some("( (ARRAY[]::TEXT[]) )")
        );
        assert_eq!(
            values_of(&[Arg::Int(1), Arg::Text("nul\0")]),
            None,
            "PostgreSQL holds no NUL: left to a prepared statement"
        );
    }
}
