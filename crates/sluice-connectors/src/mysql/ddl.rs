//! Just enough of MySQL's DDL grammar to tell which tables a statement in the binlog changes:
//! comments and quoting are honoured, so `/* x */ ALTER TABLE `a``b` ...` names table a`b.

use sluice_core::connector::SourceSchemaChange;
use sluice_core::TableName;

/// A statement's words: identifiers (unquoted), quoted strings marked, punctuation alone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    /// A backquoted identifier: never a keyword.
    Quoted(String),
    Literal,
    Symbol(char),
}

fn tokens(statement: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut characters = statement.chars().peekable();
    while let Some(character) = characters.next() {
        match character {
            character if character.is_whitespace() => {}
            '-' if characters.peek() == Some(&'-') => {
                for next in characters.by_ref() {
                    if next == '\n' {
                        break;
                    }
                }
            }
            '#' => {
                for next in characters.by_ref() {
                    if next == '\n' {
                        break;
                    }
                }
            }
            '/' if characters.peek() == Some(&'*') => {
                characters.next();
                // Executable comments (`/*!50100 ... */`) hold real syntax: read their inside.
                if characters.peek() == Some(&'!') {
                    characters.next();
                    while characters.peek().is_some_and(char::is_ascii_digit) {
                        characters.next();
                    }
                    continue;
                }
                let mut previous = ' ';
                for next in characters.by_ref() {
                    if previous == '*' && next == '/' {
                        break;
                    }
                    previous = next;
                }
            }
            '*' if characters.peek() == Some(&'/') => {
                characters.next();
            }
            '`' => {
                let mut name = String::new();
                while let Some(next) = characters.next() {
                    if next == '`' {
                        if characters.peek() == Some(&'`') {
                            characters.next();
                            name.push('`');
                            continue;
                        }
                        break;
                    }
                    name.push(next);
                }
                tokens.push(Token::Quoted(name));
            }
            quote @ ('\'' | '"') => {
                while let Some(next) = characters.next() {
                    if next == '\\' {
                        characters.next();
                    } else if next == quote {
                        if characters.peek() == Some(&quote) {
                            characters.next();
                            continue;
                        }
                        break;
                    }
                }
                tokens.push(Token::Literal);
            }
            character if character.is_alphanumeric() || character == '_' || character == '$' => {
                let mut word = String::from(character);
                while let Some(&next) = characters.peek() {
                    if next.is_alphanumeric() || next == '_' || next == '$' {
                        word.push(next);
                        characters.next();
                    } else {
                        break;
                    }
                }
                tokens.push(Token::Word(word));
            }
            other => tokens.push(Token::Symbol(other)),
        }
    }
    tokens
}

/// A cursor over a statement's tokens.
struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn keyword(&mut self, keyword: &str) -> bool {
        match self.tokens.get(self.at) {
            Some(Token::Word(word)) if word.eq_ignore_ascii_case(keyword) => {
                self.at += 1;
                true
            }
            _ => false,
        }
    }

    fn symbol(&mut self, symbol: char) -> bool {
        if self.tokens.get(self.at) == Some(&Token::Symbol(symbol)) {
            self.at += 1;
            return true;
        }
        false
    }

    fn identifier(&mut self) -> Option<String> {
        let name = match self.tokens.get(self.at)? {
            Token::Word(word) | Token::Quoted(word) => word.clone(),
            _ => return None,
        };
        self.at += 1;
        Some(name)
    }

    /// `name` or `schema.name`, the schema defaulting to the statement's.
    fn table(&mut self, schema: &str) -> Option<TableName> {
        let first = self.identifier()?;
        if self.symbol('.') {
            let name = self.identifier()?;
            return Some(TableName::new(Some(&first), &name));
        }
        Some(TableName::new(Some(schema), &first))
    }

    fn skip_words(&mut self, words: &[&str]) {
        while words.iter().any(|word| self.keyword(word)) {}
    }
}

/// The tables a DDL statement creates, alters, renames, truncates or drops, in the order named;
/// empty for anything else (DML, grants, database statements). `schema` is the statement's
/// default database.
pub fn tables_named(statement: &str, schema: &str) -> Vec<TableName> {
    let mut parser = Parser { tokens: tokens(statement), at: 0 };
    let mut tables = Vec::new();
    if parser.keyword("CREATE") {
        parser.skip_words(&["OR", "REPLACE", "TEMPORARY", "UNIQUE", "FULLTEXT", "SPATIAL", "ONLINE", "OFFLINE"]);
        if parser.keyword("TABLE") {
            parser.skip_words(&["IF", "NOT", "EXISTS"]);
            tables.extend(parser.table(schema));
        } else if parser.keyword("INDEX") {
            // CREATE INDEX name ON table
            while parser.at < parser.tokens.len() && !parser.keyword("ON") {
                parser.at += 1;
            }
            tables.extend(parser.table(schema));
        }
    } else if parser.keyword("ALTER") {
        parser.skip_words(&["ONLINE", "OFFLINE", "IGNORE"]);
        if parser.keyword("TABLE") {
            tables.extend(parser.table(schema));
        }
    } else if parser.keyword("DROP") {
        parser.skip_words(&["TEMPORARY", "ONLINE", "OFFLINE"]);
        if parser.keyword("TABLE") || parser.keyword("TABLES") {
            parser.skip_words(&["IF", "EXISTS"]);
            while let Some(table) = parser.table(schema) {
                tables.push(table);
                if !parser.symbol(',') {
                    break;
                }
            }
        } else if parser.keyword("INDEX") {
            while parser.at < parser.tokens.len() && !parser.keyword("ON") {
                parser.at += 1;
            }
            tables.extend(parser.table(schema));
        }
    } else if parser.keyword("RENAME") {
        if parser.keyword("TABLE") || parser.keyword("TABLES") {
            while let Some(from) = parser.table(schema) {
                tables.push(from);
                if !parser.keyword("TO") {
                    break;
                }
                let Some(to) = parser.table(schema) else { break };
                tables.push(to);
                if !parser.symbol(',') {
                    break;
                }
            }
        }
    } else if parser.keyword("TRUNCATE") {
        parser.keyword("TABLE");
        tables.extend(parser.table(schema));
    }
    tables
}

/// A DDL statement's effects, or why they cannot be carried. Call only for statements that
/// `tables_named` found tables in.
pub fn parse(statement: &str, schema: &str) -> Result<Vec<SourceSchemaChange>, String> {
    let mut parser = Parser { tokens: tokens(statement), at: 0 };
    if parser.keyword("CREATE") {
        parser.skip_words(&["OR", "REPLACE", "TEMPORARY"]);
        if !parser.keyword("TABLE") {
            // CREATE INDEX: indexes are not carried by the stream.
            return Ok(Vec::new());
        }
        parser.skip_words(&["IF", "NOT", "EXISTS"]);
        let table = parser.table(schema).ok_or("no table name")?;
        if parser.tokens[parser.at..]
            .iter()
            .any(|token| matches!(token, Token::Word(word) if word.eq_ignore_ascii_case("SELECT")))
        {
            return Err("CREATE TABLE ... SELECT is not supported".to_owned());
        }
        return Ok(vec![SourceSchemaChange::Create(table)]);
    }
    if parser.keyword("DROP") {
        parser.skip_words(&["TEMPORARY"]);
        if !(parser.keyword("TABLE") || parser.keyword("TABLES")) {
            return Ok(Vec::new());
        }
        parser.skip_words(&["IF", "EXISTS"]);
        let mut changes = Vec::new();
        while let Some(table) = parser.table(schema) {
            changes.push(SourceSchemaChange::Drop(table));
            if !parser.symbol(',') {
                break;
            }
        }
        return Ok(changes);
    }
    if parser.keyword("RENAME") {
        parser.skip_words(&["TABLE", "TABLES"]);
        let mut changes = Vec::new();
        while let Some(from) = parser.table(schema) {
            if !parser.keyword("TO") {
                return Err("expected TO".to_owned());
            }
            let to = parser.table(schema).ok_or("no new table name")?;
            changes.push(SourceSchemaChange::Rename { from, to });
            if !parser.symbol(',') {
                break;
            }
        }
        return Ok(changes);
    }
    if parser.keyword("TRUNCATE") {
        parser.keyword("TABLE");
        return Ok(parser.table(schema).map(SourceSchemaChange::Truncate).into_iter().collect());
    }
    if parser.keyword("ALTER") {
        parser.skip_words(&["ONLINE", "OFFLINE", "IGNORE"]);
        if !parser.keyword("TABLE") {
            return Ok(Vec::new());
        }
        let table = parser.table(schema).ok_or("no table name")?;
        return alter(parser, table, schema);
    }
    Ok(Vec::new())
}

/// The specifications of `ALTER TABLE name spec, spec, ...`.
fn alter(parser: Parser, table: TableName, schema: &str) -> Result<Vec<SourceSchemaChange>, String> {
    let (mut renamed, mut retyped) = (Vec::new(), Vec::new());
    let mut rename_to = None;
    for spec in specifications(&parser.tokens[parser.at..]) {
        let mut spec = Parser { tokens: spec, at: 0 };
        let words = |spec: &Parser| -> Vec<String> {
            spec.tokens
                .iter()
                .filter_map(|token| match token {
                    Token::Word(word) => Some(word.to_ascii_uppercase()),
                    _ => None,
                })
                .collect()
        };
        if spec.keyword("ADD") {
            if spec.keyword("PRIMARY") {
                return Err("changing the primary key is not supported".to_owned());
            }
            if [
                "INDEX",
                "KEY",
                "UNIQUE",
                "FULLTEXT",
                "SPATIAL",
                "CONSTRAINT",
                "FOREIGN",
                "CHECK",
                "PARTITION",
                "PERIOD",
                "SYSTEM",
            ]
            .iter()
            .any(|word| spec.keyword(word))
            {
                continue;
            }
            let words = words(&spec);
            let with_value = words.windows(2).any(|pair| pair[0] == "NOT" && pair[1] == "NULL")
                || words.windows(2).any(|pair| pair[0] == "DEFAULT" && pair[1] != "NULL")
                || words.iter().any(|word| matches!(word.as_str(), "AUTO_INCREMENT" | "AS" | "GENERATED" | "PRIMARY"));
            if with_value {
                return Err("a column added with NOT NULL, a default, AUTO_INCREMENT or as generated gets values the binlog does not carry for existing rows".to_owned());
            }
        } else if spec.keyword("DROP") {
            if spec.keyword("PRIMARY") {
                return Err("changing the primary key is not supported".to_owned());
            }
        } else if spec.keyword("MODIFY") {
            spec.keyword("COLUMN");
            spec.skip_words(&["IF", "EXISTS"]);
            retyped.push(spec.identifier().ok_or("no column name")?);
        } else if spec.keyword("CHANGE") {
            spec.keyword("COLUMN");
            spec.skip_words(&["IF", "EXISTS"]);
            let old = spec.identifier().ok_or("no column name")?;
            let new = spec.identifier().ok_or("no new column name")?;
            if old != new {
                renamed.push((old, new.clone()));
            }
            retyped.push(new);
        } else if spec.keyword("RENAME") {
            if spec.keyword("COLUMN") {
                let old = spec.identifier().ok_or("no column name")?;
                spec.keyword("TO");
                renamed.push((old, spec.identifier().ok_or("no new column name")?));
            } else if spec.keyword("INDEX") || spec.keyword("KEY") {
                continue;
            } else {
                let _ = spec.keyword("TO") || spec.keyword("AS");
                rename_to = Some(spec.table(schema).ok_or("no new table name")?);
            }
        } else if spec.keyword("ALTER") {
            // Defaults and index visibility: not carried, no effect on rows.
            let words = words(&spec);
            if !words.iter().any(|word| word == "DEFAULT" || word == "INVISIBLE" || word == "VISIBLE") {
                return Err("ALTER COLUMN other than its default is not supported".to_owned());
            }
        } else {
            let words = words(&spec);
            let first = words.first().map(String::as_str).unwrap_or("");
            let harmless = [
                "ENGINE",
                "ALGORITHM",
                "LOCK",
                "COMMENT",
                "AUTO_INCREMENT",
                "FORCE",
                "CHARACTER",
                "CHARSET",
                "DEFAULT",
                "COLLATE",
                "CONVERT",
                "ROW_FORMAT",
                "KEY_BLOCK_SIZE",
                "STATS_PERSISTENT",
                "STATS_AUTO_RECALC",
                "STATS_SAMPLE_PAGES",
                "PAGE_COMPRESSED",
                "ORDER",
                "ENABLE",
                "DISABLE",
                "ANALYZE",
                "OPTIMIZE",
                "CHECK",
                "REPAIR",
                "COALESCE",
                "REORGANIZE",
                "PARTITION",
                "REMOVE",
                "TRUNCATE",
                "EXCHANGE",
                "DISCARD",
                "IMPORT",
            ];
            if !harmless.contains(&first) {
                return Err(format!("the ALTER TABLE clause starting `{first}` is not supported"));
            }
        }
    }
    let mut changes = vec![SourceSchemaChange::Alter { table: table.clone(), renamed, retyped }];
    if let Some(to) = rename_to {
        changes.push(SourceSchemaChange::Rename { from: table, to });
    }
    Ok(changes)
}

/// Splits tokens at the commas outside parentheses.
fn specifications(tokens: &[Token]) -> Vec<Vec<Token>> {
    let mut specifications = vec![Vec::new()];
    let mut depth = 0usize;
    for token in tokens {
        match token {
            Token::Symbol('(') => depth += 1,
            Token::Symbol(')') => depth = depth.saturating_sub(1),
            Token::Symbol(',') if depth == 0 => {
                specifications.push(Vec::new());
                continue;
            }
            _ => {}
        }
        specifications.last_mut().expect("never empty").push(token.clone());
    }
    specifications.retain(|specification| !specification.is_empty());
    specifications
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(statement: &str) -> Vec<String> {
        tables_named(statement, "db").iter().map(ToString::to_string).collect()
    }

    #[test]
    fn table_statements_name_their_tables() {
        assert_eq!(names("CREATE TABLE IF NOT EXISTS t (id int)"), ["db.t"]);
        assert_eq!(names("/* app */ alter table `other`.`we``ird` add column c int"), ["other.we`ird"]);
        assert_eq!(names("DROP TABLE IF EXISTS a, other.b /* generated by server */"), ["db.a", "other.b"]);
        assert_eq!(names("RENAME TABLE a TO b, c TO other.d"), ["db.a", "db.b", "db.c", "other.d"]);
        assert_eq!(names("TRUNCATE t"), ["db.t"]);
        assert_eq!(names("CREATE UNIQUE INDEX k ON t (c)"), ["db.t"]);
    }

    #[test]
    fn alter_statements_become_column_changes() {
        let alter = |statement: &str| parse(statement, "db");
        let table = TableName::new(Some("db"), "t");
        assert_eq!(
            alter("ALTER TABLE t ADD COLUMN c VARCHAR(10) NULL, CHANGE a a2 VARCHAR(30), MODIFY b BIGINT, RENAME COLUMN x TO y, ADD INDEX (b), ENGINE = InnoDB").unwrap(),
            vec![SourceSchemaChange::Alter {
                table: table.clone(),
                renamed: vec![("a".into(), "a2".into()), ("x".into(), "y".into())],
                retyped: vec!["a2".into(), "b".into()],
            }]
        );
        assert_eq!(
            alter("ALTER TABLE t RENAME TO other.u").unwrap()[1],
            SourceSchemaChange::Rename { from: table, to: TableName::new(Some("other"), "u") }
        );
        assert!(alter("ALTER TABLE t ADD COLUMN d INT NOT NULL DEFAULT 5").unwrap_err().contains("existing rows"));
        assert!(alter("ALTER TABLE t DROP PRIMARY KEY").is_err());
        assert!(alter("CREATE TABLE t2 AS SELECT * FROM t").is_err());
        assert_eq!(alter("RENAME TABLE a TO b").unwrap().len(), 1);
    }

    #[test]
    fn other_statements_name_no_table() {
        assert!(names("CREATE DATABASE x").is_empty());
        assert!(names("GRANT SELECT ON db.t TO 'u'@'%'").is_empty());
        assert!(names("INSERT INTO t VALUES ('DROP TABLE t')").is_empty());
        assert!(names("CREATE USER 'x' IDENTIFIED BY 'ALTER TABLE t'").is_empty());
    }
}
