//! The SQL text of a job's transforms (`select`, `where`): parsed when the job is read, so a
//! mistake is reported at its line; the transform stage compiles what this parses.

use sqlparser::ast as sql;
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

/// Parses a projection (`id, name AS customer, upper(email) AS email`) into select items.
pub(crate) fn parse_projection(text: &str) -> Result<Vec<sql::SelectItem>, String> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(|error| error.to_string())?;
    let items = parser.parse_comma_separated(Parser::parse_select_item).map_err(|error| error.to_string())?;
    expect_end(&parser)?;
    Ok(items)
}

/// Parses a predicate (`id > 10 AND country IN ('FR', 'DE')`).
pub(crate) fn parse_predicate(text: &str) -> Result<sql::Expr, String> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(|error| error.to_string())?;
    let expression = parser.parse_expr().map_err(|error| error.to_string())?;
    expect_end(&parser)?;
    Ok(expression)
}

fn expect_end(parser: &Parser<'_>) -> Result<(), String> {
    let next = parser.peek_token();
    if next.token == Token::EOF {
        return Ok(());
    }
    Err(format!("unexpected `{}` at line {}, column {}", next.token, next.span.start.line, next.span.start.column))
}
