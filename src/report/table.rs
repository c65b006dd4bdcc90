//! Plain-text tables that fit the terminal, with color only where it helps.
//!
//! Columns are as wide as their widest cell, except the flexible ones,
//! which give up width (from the widest down) until the table fits; a cut
//! cell ends with `…`. Color is for terminals only, and never with
//! `NO_COLOR` set.

use std::fmt::Write as _;

/// How a cell is drawn on a color terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tone {
    Plain,
    Good,
    Bad,
    Warn,
    Dim,
    Bold,
}

impl Tone {
    fn code(self) -> &'static str {
        match self {
            Self::Plain => "",
            Self::Good => "\x1b[32m",
            Self::Bad => "\x1b[31m",
            Self::Warn => "\x1b[33m",
            Self::Dim => "\x1b[2m",
            Self::Bold => "\x1b[1m",
        }
    }
}

pub(crate) struct Column {
    pub(crate) title: &'static str,
    /// May be cut to fit.
    pub(crate) flexible: bool,
    pub(crate) right: bool,
}

impl Column {
    pub(crate) const fn fixed(title: &'static str) -> Self {
        Self {
            title,
            flexible: false,
            right: false,
        }
    }

    pub(crate) const fn number(title: &'static str) -> Self {
        Self {
            title,
            flexible: false,
            right: true,
        }
    }

    pub(crate) const fn flexible(title: &'static str) -> Self {
        Self {
            title,
            flexible: true,
            right: false,
        }
    }
}

/// Where output goes: its width and whether it takes color.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Style {
    pub(crate) width: usize,
    pub(crate) color: bool,
}

impl Style {
    /// Stdout as it is: the terminal's width (or `COLUMNS`, or 100), color
    /// on a terminal unless `NO_COLOR` is set.
    pub(crate) fn stdout(settings: &crate::settings::Settings) -> Self {
        use std::io::IsTerminal as _;
        let terminal = std::io::stdout().is_terminal();
        Self {
            width: settings.columns.or_else(terminal_width).unwrap_or(100),
            color: terminal && !settings.no_color,
        }
    }

    /// `text` in `tone`, its own control characters escaped.
    pub(crate) fn paint(&self, tone: Tone, text: &str) -> String {
        let text = super::escape(text);
        if self.color && tone != Tone::Plain {
            format!("{}{text}\x1b[0m", tone.code())
        } else {
            text.into_owned()
        }
    }
}

/// The terminal's width, if stdout is one.
fn terminal_width() -> Option<usize> {
    terminal_size::terminal_size_of(std::io::stdout())
        .map(|(terminal_size::Width(width), _)| usize::from(width))
        .filter(|width| *width > 0)
}

/// `text` cut to `width` characters, ending with `…` if cut; line breaks
/// and tabs become spaces so a cell stays on its line, other control
/// characters are escaped.
pub(crate) fn fit(text: &str, width: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| {
            if matches!(c, '\n' | '\r' | '\t') {
                ' '
            } else {
                c
            }
        })
        .collect();
    let flat = super::escape(&flat).into_owned();
    if flat.chars().count() <= width {
        return flat;
    }
    if width == 0 {
        return String::new();
    }
    let mut cut: String = flat.chars().take(width - 1).collect();
    cut.push('…');
    cut
}

/// Renders `rows` under `columns`, each cell with its tone.
pub(crate) fn render(style: &Style, columns: &[Column], rows: &[Vec<(String, Tone)>]) -> String {
    const GAP: usize = 2;
    let count = columns.len();
    let mut widths: Vec<usize> = columns
        .iter()
        .map(|column| column.title.chars().count())
        .collect();
    for row in rows {
        for (width, (cell, _)) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let total = |widths: &[usize]| widths.iter().sum::<usize>() + GAP * count.saturating_sub(1);
    // Shrink the widest flexible column, one character at a time, down to
    // its title's width.
    while total(&widths) > style.width {
        let widest = (0..count)
            .filter(|&i| columns[i].flexible && widths[i] > columns[i].title.chars().count().max(8))
            .max_by_key(|&i| widths[i]);
        match widest {
            Some(i) => widths[i] -= 1,
            None => break,
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<(String, Tone)>, out: &mut String| {
        let mut text = String::new();
        for (i, (cell, tone)) in cells.into_iter().enumerate() {
            let width = widths[i];
            let cell = fit(&cell, width);
            let pad = width.saturating_sub(cell.chars().count());
            let last = i + 1 == count;
            if columns[i].right {
                text.push_str(&" ".repeat(pad));
                text.push_str(&style.paint(tone, &cell));
            } else {
                text.push_str(&style.paint(tone, &cell));
                if !last {
                    text.push_str(&" ".repeat(pad));
                }
            }
            if !last {
                text.push_str(&" ".repeat(GAP));
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    let header = columns
        .iter()
        .map(|column| (column.title.to_owned(), Tone::Bold))
        .collect();
    line(header, &mut out);
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flexible_columns_give_way_with_an_ellipsis() {
        let style = Style {
            width: 30,
            color: false,
        };
        let columns = [
            Column::fixed("ID"),
            Column::number("N"),
            Column::flexible("COMMAND"),
        ];
        let rows = vec![
            vec![
                ("a".into(), Tone::Plain),
                ("7".into(), Tone::Plain),
                ("python3 agent.py --long-flag value".into(), Tone::Plain),
            ],
            vec![
                ("bb".into(), Tone::Plain),
                ("12".into(), Tone::Plain),
                ("sh".into(), Tone::Plain),
            ],
        ];
        assert_eq!(
            render(&style, &columns, &rows),
            "ID   N  COMMAND\na    7  python3 agent.py --lo…\nbb  12  sh\n"
        );
        let colored = Style {
            width: 80,
            color: true,
        };
        assert_eq!(colored.paint(Tone::Bad, "failed"), "\x1b[31mfailed\x1b[0m");
        assert_eq!(fit("a\nb", 5), "a b");
    }
}
