//! Plain-text tables laid out as kubectl lays them out: upper-case headers, left-aligned columns
//! three spaces apart, no trailing blanks.

/// A table of text cells; rows shorter than the header are padded with empty cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Space between two columns.
const GAP: usize = 3;

impl Table {
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push<S: Into<String>>(&mut self, row: impl IntoIterator<Item = S>) {
        self.rows.push(row.into_iter().map(Into::into).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table, each line prefixed with `indent` and ended by a newline. Line breaks inside a
    /// cell are shown as spaces, so every row stays one line.
    pub fn render(&self, indent: &str) -> String {
        let cells: Vec<Vec<String>> = std::iter::once(&self.headers)
            .chain(&self.rows)
            .map(|row| {
                (0..self.headers.len())
                    .map(|i| {
                        row.get(i)
                            .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &cells {
            let mut line = String::from(indent);
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count() + GAP;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_three_spaces_apart_without_trailing_blanks() {
        let mut t = Table::new(["NAME", "PHASE", "AGE"]);
        t.push(["basic", "Succeeded", "5m"]);
        t.push(["a-much-longer-name", "Running", ""]);
        assert_eq!(
            t.render(""),
            "NAME                 PHASE       AGE\n\
             basic                Succeeded   5m\n\
             a-much-longer-name   Running\n"
        );
    }

    #[test]
    fn short_rows_are_padded_and_newlines_flattened() {
        let mut t = Table::new(["A", "B"]);
        t.push(["x"]);
        t.push(["two\nlines", "ü"]);
        assert_eq!(t.render("  "), "  A           B\n  x\n  two lines   ü\n");
        assert!(!t.is_empty());
        assert!(Table::new(["A"]).render("").starts_with("A\n"));
    }
}
