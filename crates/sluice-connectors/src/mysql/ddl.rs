//! Just enough of MySQL's DDL grammar to tell which tables a statement in the binlog changes:
//! comments and quoting are honoured, so `/* x */ ALTER TABLE `a``b` ...` names table a`b.

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
    fn other_statements_name_no_table() {
        assert!(names("CREATE DATABASE x").is_empty());
        assert!(names("GRANT SELECT ON db.t TO 'u'@'%'").is_empty());
        assert!(names("INSERT INTO t VALUES ('DROP TABLE t')").is_empty());
        assert!(names("CREATE USER 'x' IDENTIFIED BY 'ALTER TABLE t'").is_empty());
    }
}
