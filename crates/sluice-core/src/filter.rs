//! The `tables` filter: include globs, with `!` for excludes.

use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::TableName;

/// Selects tables by `namespace.table` globs (`*` any run, `?` one character). A pattern without
/// a dot matches the table name in any namespace. An empty filter selects every table.
#[derive(Debug, Clone, Default)]
pub struct TableFilter {
    includes: Vec<String>,
    excludes: Vec<String>,
}

impl TableFilter {
    pub fn new(patterns: &[String]) -> TableFilter {
        let mut filter = TableFilter::default();
        for pattern in patterns {
            match pattern.strip_prefix('!') {
                Some(exclude) => filter.excludes.push(exclude.to_owned()),
                None => filter.includes.push(pattern.clone()),
            }
        }
        filter
    }

    /// The namespaces the filter selects whole, when that is all it includes (`app.*`,
    /// `sales.*`; excludes apart): a source may then follow tables created in them later.
    pub fn whole_namespaces(&self) -> Option<Vec<&str>> {
        if self.includes.is_empty() {
            return None;
        }
        self.includes
            .iter()
            .map(|pattern| pattern.strip_suffix(".*").filter(|namespace| !namespace.contains(['*', '?', '.'])))
            .collect()
    }

    /// The include patterns that name one table exactly (no glob characters) and match none of
    /// `available`: typos, or tables the user cannot see.
    pub fn unmatched_literals(&self, available: &[TableName]) -> Vec<&str> {
        self.includes
            .iter()
            .filter(|pattern| !pattern.contains(['*', '?']))
            .filter(|pattern| !available.iter().any(|table| pattern_matches(pattern, table)))
            .map(String::as_str)
            .collect()
    }

    pub fn matches(&self, table: &TableName) -> bool {
        let included = self.includes.is_empty() || self.includes.iter().any(|pattern| pattern_matches(pattern, table));
        included && !self.excludes.iter().any(|pattern| pattern_matches(pattern, table))
    }

    /// Keeps the selected tables, sorted, and fails if an include without glob characters names
    /// a table that does not exist (a typo must not silently copy nothing).
    pub fn select(&self, available: Vec<TableName>) -> Result<Vec<TableName>> {
        for (index, pattern) in self.includes.iter().enumerate() {
            let literal = !pattern.contains(['*', '?']);
            if literal && !available.iter().any(|table| pattern_matches(pattern, table)) {
                let mut known: Vec<String> = available.iter().map(ToString::to_string).collect();
                known.sort();
                known.truncate(20);
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!("table `{pattern}` named in source.tables[{index}] does not exist"),
                )
                .on(Side::Source)
                .hint(format!(
                    "tables found: {}",
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                )));
            }
        }
        let mut selected: Vec<TableName> = available.into_iter().filter(|table| self.matches(table)).collect();
        selected.sort();
        Ok(selected)
    }
}

fn pattern_matches(pattern: &str, table: &TableName) -> bool {
    match (pattern.contains('.'), &table.namespace) {
        (true, Some(namespace)) => glob(pattern, &format!("{namespace}.{}", table.name)),
        (true, None) => false,
        (false, _) => glob(pattern, &table.name),
    }
}

/// Matches `*` and `?` over characters.
fn glob(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&character) if character == '?' || character == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    p = star + 1;
                    t = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&character| character == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_namespaces_only_when_every_include_is_one() {
        let filter = |patterns: &[&str]| {
            TableFilter::new(&patterns.iter().map(|pattern| pattern.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(filter(&["app.*", "sales.*", "!app.tmp"]).whole_namespaces(), Some(vec!["app", "sales"]));
        assert_eq!(filter(&["app.*", "sales.orders"]).whole_namespaces(), None);
        assert_eq!(filter(&["a*.*"]).whole_namespaces(), None);
        assert_eq!(filter(&[]).whole_namespaces(), None);
    }

    fn names(filter: &TableFilter, tables: &[&str]) -> Vec<String> {
        let available = tables.iter().map(|table| TableName::parse(table)).collect();
        filter.select(available).unwrap().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn includes_and_excludes_select_tables() {
        let filter = TableFilter::new(&["shop.*".into(), "!shop.tmp_*".into()]);
        assert_eq!(
            names(&filter, &["shop.orders", "shop.tmp_x", "crm.users", "shop.items"]),
            vec!["shop.items", "shop.orders"]
        );
        let filter = TableFilter::new(&["or?ers".into()]);
        assert_eq!(names(&filter, &["orders", "shop.orders", "order"]), vec!["orders", "shop.orders"]);
        assert_eq!(names(&TableFilter::default(), &["b", "a"]), vec!["a", "b"]);
    }

    #[test]
    fn a_missing_literal_table_is_an_error_naming_it() {
        let filter = TableFilter::new(&["orders".into(), "custmers".into()]);
        let error = filter.select(vec![TableName::parse("orders"), TableName::parse("customers")]).unwrap_err();
        assert!(error.to_string().contains("`custmers` named in source.tables[1] does not exist"), "{error}");
        assert!(error.to_string().contains("customers, orders"), "{error}");
    }
}
