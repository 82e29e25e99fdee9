//! The transform stage's small expression language: SQL select-list items and predicates,
//! parsed by `sqlparser` and compiled against one table's columns into a tree that evaluates a
//! row without looking anything up by name.
//!
//! What it speaks: column names (unquoted names match case-insensitively, as MySQL's do;
//! `"quoted"` and `` `quoted` `` exactly), literals, `+ - * / %`, `||`, comparisons, `AND OR
//! NOT`, `IS [NOT] NULL`, `[NOT] IN (…)`, `[NOT] BETWEEN`, `[NOT] LIKE`, `CASE`, `CAST(… AS
//! type)` (lossless only: a value that would change is an error), a few deterministic functions
//! (see [`Function`]), and the metadata columns `__table_name__`, `__schema_name__` (also
//! `__database_name__`, `__namespace_name__`). Comparisons of text are by code point (binary),
//! not by the source column's collation. Nothing non-deterministic (no `NOW()`, no `RAND()`):
//! a change stream evaluates the same expression on a row's before and after images, and a
//! replayed change must give what it gave the first time.

use std::borrow::Cow;
use std::cmp::Ordering;

use sqlparser::ast as sql;

use crate::schema::{Column, DataType, TableName};
#[cfg(test)]
use crate::spec::sql_text::{parse_predicate, parse_projection};
use crate::value::{Date, DateTime, Decimal, Time, Value};

/// What names resolve to while compiling: one table's columns and its name.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub table: &'a TableName,
    pub columns: &'a [Column],
}

impl Scope<'_> {
    /// The column an identifier names: exactly when quoted, else case-insensitively (an exact
    /// match first).
    pub fn resolve(&self, name: &str, quoted: bool) -> Option<usize> {
        self.columns.iter().position(|column| column.name == name).or_else(|| {
            if quoted {
                return None;
            }
            let mut matches =
                self.columns.iter().enumerate().filter(|(_, column)| column.name.eq_ignore_ascii_case(name));
            let first = matches.next()?;
            matches.next().is_none().then_some(first.0)
        })
    }

    fn metadata(&self, name: &str) -> Option<Value> {
        let namespace = || Value::Text(self.table.namespace.clone().unwrap_or_default());
        match name.to_ascii_lowercase().as_str() {
            "__table_name__" => Some(Value::Text(self.table.name.clone())),
            "__schema_name__" | "__database_name__" | "__namespace_name__" => Some(namespace()),
            _ => None,
        }
    }

    fn names(&self) -> String {
        self.columns.iter().map(|column| column.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// A compiled expression with the type and nullability of what it yields.
#[derive(Debug, Clone)]
pub struct Expression {
    node: Node,
    pub data_type: DataType,
    pub nullable: bool,
}

/// The deterministic functions a transform may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Upper,
    Lower,
    Trim,
    LeftTrim,
    RightTrim,
    /// Characters.
    Length,
    /// Bytes of the UTF-8 form.
    OctetLength,
    /// `SUBSTRING(s, start[, length])`, 1-based, in characters.
    Substring,
    Left,
    Right,
    Replace,
    /// NULL when any argument is NULL.
    Concat,
    /// `CONCAT_WS(separator, …)`: NULL arguments are skipped.
    ConcatWithSeparator,
    Coalesce,
    NullIf,
    Abs,
    Round,
    Floor,
    Ceil,
    /// Lowercase hex SHA-256 of the value's text (or bytes).
    Sha256,
}

impl Function {
    fn named(name: &str) -> Option<Function> {
        Some(match name.to_ascii_lowercase().as_str() {
            "upper" | "ucase" => Function::Upper,
            "lower" | "lcase" => Function::Lower,
            "trim" => Function::Trim,
            "ltrim" => Function::LeftTrim,
            "rtrim" => Function::RightTrim,
            "length" | "char_length" | "character_length" => Function::Length,
            "octet_length" => Function::OctetLength,
            "substring" | "substr" => Function::Substring,
            "left" => Function::Left,
            "right" => Function::Right,
            "replace" => Function::Replace,
            "concat" => Function::Concat,
            "concat_ws" => Function::ConcatWithSeparator,
            "coalesce" | "ifnull" => Function::Coalesce,
            "nullif" => Function::NullIf,
            "abs" => Function::Abs,
            "round" => Function::Round,
            "floor" => Function::Floor,
            "ceil" | "ceiling" => Function::Ceil,
            "sha256" => Function::Sha256,
            _ => return None,
        })
    }

    /// The argument counts it takes.
    fn arity(self) -> (usize, usize) {
        match self {
            Function::Upper
            | Function::Lower
            | Function::Trim
            | Function::LeftTrim
            | Function::RightTrim
            | Function::Length
            | Function::OctetLength
            | Function::Abs
            | Function::Floor
            | Function::Ceil
            | Function::Sha256 => (1, 1),
            Function::Substring => (2, 3),
            Function::Left | Function::Right | Function::NullIf => (2, 2),
            Function::Replace => (3, 3),
            Function::Round => (1, 2),
            Function::Concat | Function::Coalesce => (1, usize::MAX),
            Function::ConcatWithSeparator => (2, usize::MAX),
        }
    }
}

const FUNCTIONS: &str = "upper, lower, trim, ltrim, rtrim, length, char_length, octet_length, substring, substr, left, right, replace, concat, concat_ws, coalesce, ifnull, nullif, abs, round, floor, ceil, sha256";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arithmetic {
    Add,
    Subtract,
    Multiply,
    Divide,
    Remainder,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Comparison {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            Comparison::Equal => ordering == Ordering::Equal,
            Comparison::NotEqual => ordering != Ordering::Equal,
            Comparison::Less => ordering == Ordering::Less,
            Comparison::LessOrEqual => ordering != Ordering::Greater,
            Comparison::Greater => ordering == Ordering::Greater,
            Comparison::GreaterOrEqual => ordering != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone)]
enum Node {
    Column(usize),
    Literal(Value),
    Not(Box<Node>),
    Negate(Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Compare(Comparison, Box<Node>, Box<Node>),
    Arithmetic(Arithmetic, Box<Node>, Box<Node>),
    Concat(Box<Node>, Box<Node>),
    IsNull {
        node: Box<Node>,
        negated: bool,
    },
    /// `x IS [NOT] TRUE` / `x IS [NOT] FALSE`, by SQL's truth of `x` (NULL is neither).
    IsTruth {
        node: Box<Node>,
        truth: bool,
        negated: bool,
    },
    In {
        node: Box<Node>,
        list: Vec<Node>,
        negated: bool,
    },
    Between {
        node: Box<Node>,
        low: Box<Node>,
        high: Box<Node>,
        negated: bool,
    },
    Like {
        node: Box<Node>,
        pattern: Box<Node>,
        negated: bool,
        case_insensitive: bool,
    },
    Case {
        operand: Option<Box<Node>>,
        branches: Vec<(Node, Node)>,
        otherwise: Option<Box<Node>>,
    },
    Cast {
        node: Box<Node>,
        to: DataType,
    },
    Call {
        function: Function,
        arguments: Vec<Node>,
    },
}

impl Expression {
    /// Compiles a parsed expression against `scope`. Errors name what is not understood.
    pub fn compile(expression: &sql::Expr, scope: Scope<'_>) -> Result<Expression, String> {
        let (node, data_type, nullable) = compile(expression, scope)?;
        Ok(Expression { node, data_type, nullable })
    }

    /// The source column this expression is, when it is a plain column reference.
    pub fn column(&self) -> Option<usize> {
        match self.node {
            Node::Column(index) => Some(index),
            _ => None,
        }
    }

    /// Evaluates the expression on a row of the scope's table. A value the source did not send
    /// (`Value::Unchanged`) passes through a plain column; an expression over it is unknown:
    /// unchanged as well when every column it reads is, else an error naming the column.
    pub fn evaluate<'a>(&'a self, row: &'a [Value]) -> Result<Cow<'a, Value>, String> {
        if !matches!(self.node, Node::Column(_)) && row.iter().any(|value| matches!(value, Value::Unchanged)) {
            let mut read = Vec::new();
            columns_read(&self.node, &mut read);
            let unsent: Vec<usize> =
                read.iter().copied().filter(|&index| matches!(row[index], Value::Unchanged)).collect();
            if !read.is_empty() && unsent.len() == read.len() {
                return Ok(Cow::Owned(Value::Unchanged));
            }
            if let Some(&index) = unsent.first() {
                return Err(format!(
                    "the expression reads column #{} beside others, and an update left it unchanged without the source sending its value",
                    index + 1
                ));
            }
        }
        evaluate(&self.node, row)
    }

    /// Evaluates a predicate: only TRUE passes (NULL does not, as in SQL's WHERE). A predicate
    /// over values the source did not send cannot be judged: an error, never a silent drop.
    pub fn holds(&self, row: &[Value]) -> Result<bool, String> {
        match &*self.evaluate(row)? {
            Value::Unchanged => {
                Err("the filter reads only values an update left unchanged without the source sending them".into())
            }
            value => Ok(truth(value) == Some(true)),
        }
    }
}

type Compiled = (Node, DataType, bool);

fn unsupported(what: impl std::fmt::Display) -> String {
    format!("`{what}` is not supported in a transform expression")
}

fn compile(expression: &sql::Expr, scope: Scope<'_>) -> Result<Compiled, String> {
    use sql::Expr;
    let boxed = |expression: &Expr| compile(expression, scope);
    Ok(match expression {
        Expr::Identifier(ident) => identifier(ident, scope)?,
        Expr::CompoundIdentifier(parts) => match parts.last() {
            Some(ident) => identifier(ident, scope)?,
            None => return Err(unsupported(expression)),
        },
        Expr::Nested(inner) => boxed(inner)?,
        Expr::Value(value) => literal(&value.value)?,
        Expr::TypedString(typed) => {
            let text = match &typed.value.value {
                sql::Value::SingleQuotedString(text) | sql::Value::DoubleQuotedString(text) => text.clone(),
                _ => return Err(unsupported(expression)),
            };
            let to = data_type(&typed.data_type)?;
            let value = cast(Value::Text(text), &to)?;
            (Node::Literal(value), to, false)
        }
        Expr::UnaryOp { op, expr } => {
            let (node, data_type, nullable) = boxed(expr)?;
            match op {
                sql::UnaryOperator::Not => (Node::Not(Box::new(node)), DataType::Boolean, nullable),
                sql::UnaryOperator::Minus => (Node::Negate(Box::new(node)), signed(data_type), nullable),
                sql::UnaryOperator::Plus => (node, data_type, nullable),
                _ => return Err(unsupported(expression)),
            }
        }
        Expr::BinaryOp { left, op, right } => {
            let (left, left_type, left_null) = boxed(left)?;
            let (right, right_type, right_null) = boxed(right)?;
            let nullable = left_null || right_null;
            let (left, right) = (Box::new(left), Box::new(right));
            use sql::BinaryOperator as B;
            let comparison =
                |comparison| (Node::Compare(comparison, left.clone(), right.clone()), DataType::Boolean, nullable);
            let arithmetic = |operation| {
                let data_type = arithmetic_type(operation, &left_type, &right_type);
                (
                    Node::Arithmetic(operation, left.clone(), right.clone()),
                    data_type,
                    nullable || operation == Arithmetic::Divide,
                )
            };
            match op {
                B::And => (Node::And(left, right), DataType::Boolean, nullable),
                B::Or => (Node::Or(left, right), DataType::Boolean, nullable),
                B::Eq => comparison(Comparison::Equal),
                B::NotEq => comparison(Comparison::NotEqual),
                B::Lt => comparison(Comparison::Less),
                B::LtEq => comparison(Comparison::LessOrEqual),
                B::Gt => comparison(Comparison::Greater),
                B::GtEq => comparison(Comparison::GreaterOrEqual),
                B::Plus => arithmetic(Arithmetic::Add),
                B::Minus => arithmetic(Arithmetic::Subtract),
                B::Multiply => arithmetic(Arithmetic::Multiply),
                B::Divide => arithmetic(Arithmetic::Divide),
                B::Modulo => arithmetic(Arithmetic::Remainder),
                B::StringConcat => (Node::Concat(left, right), DataType::Text { length: None, fixed: false }, nullable),
                _ => return Err(unsupported(op)),
            }
        }
        Expr::IsNull(inner) | Expr::IsNotNull(inner) => {
            let (node, _, _) = boxed(inner)?;
            let negated = matches!(expression, Expr::IsNotNull(_));
            (Node::IsNull { node: Box::new(node), negated }, DataType::Boolean, false)
        }
        Expr::IsTrue(inner) | Expr::IsNotTrue(inner) | Expr::IsFalse(inner) | Expr::IsNotFalse(inner) => {
            let (node, _, _) = boxed(inner)?;
            let wanted = matches!(expression, Expr::IsTrue(_) | Expr::IsNotTrue(_));
            let negated = matches!(expression, Expr::IsNotTrue(_) | Expr::IsNotFalse(_));
            // `x IS TRUE` is never NULL: a NULL x is simply not true.
            (Node::IsTruth { node: Box::new(node), truth: wanted, negated }, DataType::Boolean, false)
        }
        Expr::In { expr, target: sql::InTarget::List(list), negated, .. } => {
            let (node, _, nullable) = boxed(expr)?;
            let mut items = Vec::with_capacity(list.len());
            let mut any_null = nullable;
            for item in list {
                let (item, _, item_null) = boxed(item)?;
                any_null |= item_null;
                items.push(item);
            }
            (Node::In { node: Box::new(node), list: items, negated: *negated }, DataType::Boolean, any_null)
        }
        Expr::Between { expr, negated, low, high } => {
            let (node, _, a) = boxed(expr)?;
            let (low, _, b) = boxed(low)?;
            let (high, _, c) = boxed(high)?;
            let node =
                Node::Between { node: Box::new(node), low: Box::new(low), high: Box::new(high), negated: *negated };
            (node, DataType::Boolean, a || b || c)
        }
        Expr::Like { negated, expr, pattern, escape_char: None, any: false }
        | Expr::ILike { negated, expr, pattern, escape_char: None, any: false } => {
            let (node, _, a) = boxed(expr)?;
            let (pattern, _, b) = boxed(pattern)?;
            let case_insensitive = matches!(expression, Expr::ILike { .. });
            let node =
                Node::Like { node: Box::new(node), pattern: Box::new(pattern), negated: *negated, case_insensitive };
            (node, DataType::Boolean, a || b)
        }
        Expr::Case { operand, conditions, else_result, .. } => {
            let operand = operand.as_deref().map(boxed).transpose()?.map(|(node, _, _)| Box::new(node));
            let mut branches = Vec::with_capacity(conditions.len());
            let mut types = Vec::with_capacity(conditions.len() + 1);
            let mut nullable = else_result.is_none();
            for branch in conditions {
                let (condition, _, _) = boxed(&branch.condition)?;
                let (result, data_type, result_null) = boxed(&branch.result)?;
                nullable |= result_null;
                types.push(data_type);
                branches.push((condition, result));
            }
            let otherwise = match else_result {
                Some(otherwise) => {
                    let (node, data_type, otherwise_null) = boxed(otherwise)?;
                    nullable |= otherwise_null;
                    types.push(data_type);
                    Some(Box::new(node))
                }
                None => None,
            };
            let results = branches.iter().map(|(_, result)| result).chain(otherwise.as_deref());
            let data_type = common_types(results.zip(types));
            (Node::Case { operand, branches, otherwise }, data_type, nullable)
        }
        Expr::Cast { kind: sql::CastKind::Cast | sql::CastKind::DoubleColon, expr, data_type: to, format: None } => {
            let (node, _, nullable) = boxed(expr)?;
            let to = data_type(to)?;
            (Node::Cast { node: Box::new(node), to: to.clone() }, to, nullable)
        }
        Expr::Substring { expr, substring_from, substring_for, .. } => {
            let mut arguments = vec![boxed(expr)?];
            arguments.push(match substring_from {
                Some(from) => boxed(from)?,
                None => (Node::Literal(Value::Int(1)), DataType::Integer { bytes: 8, unsigned: false }, false),
            });
            if let Some(length) = substring_for {
                arguments.push(boxed(length)?);
            }
            call(Function::Substring, arguments)?
        }
        Expr::Trim { trim_where, trim_what: None, expr, trim_characters: None } => {
            let function = match trim_where {
                None | Some(sql::TrimWhereField::Both) => Function::Trim,
                Some(sql::TrimWhereField::Leading) => Function::LeftTrim,
                Some(sql::TrimWhereField::Trailing) => Function::RightTrim,
            };
            call(function, vec![boxed(expr)?])?
        }
        Expr::Ceil { expr, field: sql::CeilFloorKind::DateTimeField(sql::DateTimeField::NoDateTime) } => {
            call(Function::Ceil, vec![boxed(expr)?])?
        }
        Expr::Floor { expr, field: sql::CeilFloorKind::DateTimeField(sql::DateTimeField::NoDateTime) } => {
            call(Function::Floor, vec![boxed(expr)?])?
        }
        Expr::Function(function) => {
            let name = function.name.to_string();
            let Some(known) = Function::named(&name) else {
                return Err(format!("unknown function `{name}`; a transform knows: {FUNCTIONS}"));
            };
            let arguments = match &function.args {
                sql::FunctionArguments::None => Vec::new(),
                sql::FunctionArguments::List(list) if list.duplicate_treatment.is_none() && list.clauses.is_empty() => {
                    let mut arguments = Vec::with_capacity(list.args.len());
                    for argument in &list.args {
                        match argument {
                            sql::FunctionArg::Unnamed(sql::FunctionArgExpr::Expr(argument)) => {
                                arguments.push(boxed(argument)?)
                            }
                            _ => return Err(unsupported(argument)),
                        }
                    }
                    arguments
                }
                _ => return Err(unsupported(expression)),
            };
            if function.filter.is_some() || function.over.is_some() || !function.within_group.is_empty() {
                return Err(unsupported(expression));
            }
            call(known, arguments)?
        }
        _ => return Err(unsupported(expression)),
    })
}

fn identifier(ident: &sql::Ident, scope: Scope<'_>) -> Result<Compiled, String> {
    if let Some(index) = scope.resolve(&ident.value, ident.quote_style.is_some()) {
        let column = &scope.columns[index];
        return Ok((Node::Column(index), column.data_type.clone(), column.nullable));
    }
    if let Some(value) = scope.metadata(&ident.value) {
        return Ok((Node::Literal(value), DataType::Text { length: None, fixed: false }, false));
    }
    Err(format!("table {} has no column `{}`; its columns: {}", scope.table, ident.value, scope.names()))
}

fn literal(value: &sql::Value) -> Result<Compiled, String> {
    Ok(match value {
        sql::Value::Number(text, _) => {
            if let Ok(integer) = text.parse::<i64>() {
                (Node::Literal(Value::Int(integer)), DataType::Integer { bytes: 8, unsigned: false }, false)
            } else if text.contains(['e', 'E']) {
                let float = text.parse::<f64>().map_err(|_| format!("`{text}` is not a number"))?;
                (Node::Literal(Value::Float64(float)), DataType::Float64, false)
            } else {
                let decimal = Decimal::parse(text).ok_or_else(|| format!("`{text}` is not a number"))?;
                let scale = decimal.scale() as u32;
                (
                    Node::Literal(Value::Decimal(decimal)),
                    DataType::Decimal { precision: Some(65), scale: Some(scale) },
                    false,
                )
            }
        }
        sql::Value::SingleQuotedString(text) | sql::Value::DoubleQuotedString(text) => {
            let length = text.chars().count() as u32;
            (
                Node::Literal(Value::Text(text.clone())),
                DataType::Text { length: Some(length.max(1)), fixed: false },
                false,
            )
        }
        sql::Value::Boolean(value) => (Node::Literal(Value::Bool(*value)), DataType::Boolean, false),
        sql::Value::Null => (Node::Literal(Value::Null), DataType::Text { length: None, fixed: false }, true),
        other => return Err(unsupported(other)),
    })
}

fn call(function: Function, arguments: Vec<Compiled>) -> Result<Compiled, String> {
    let (least, most) = function.arity();
    if arguments.len() < least || arguments.len() > most {
        let expected = match (least, most) {
            (least, most) if least == most => format!("{least}"),
            (least, usize::MAX) => format!("at least {least}"),
            (least, most) => format!("{least} to {most}"),
        };
        return Err(format!("{function:?} takes {expected} argument(s), not {}", arguments.len()).to_lowercase());
    }
    let any_null = arguments.iter().any(|(_, _, nullable)| *nullable);
    let first_type = arguments[0].1.clone();
    let text = DataType::Text { length: None, fixed: false };
    let integer = DataType::Integer { bytes: 8, unsigned: false };
    let (data_type, nullable) = match function {
        // Case mapping may lengthen text (`upper('Maße')` is `MASSE`): no length is kept.
        Function::Upper | Function::Lower => (text, any_null),
        Function::Trim | Function::LeftTrim | Function::RightTrim => (text_like(&first_type), any_null),
        Function::Substring | Function::Left | Function::Right => (text_like(&first_type), any_null),
        Function::Replace | Function::Concat => (text, any_null),
        Function::ConcatWithSeparator => (text, arguments[0].2),
        Function::Length | Function::OctetLength => (integer, any_null),
        Function::Coalesce => {
            let data_type = common_types(arguments.iter().map(|(node, data_type, _)| (node, data_type.clone())));
            (data_type, arguments.iter().all(|(_, _, nullable)| *nullable))
        }
        Function::NullIf => (first_type, true),
        Function::Abs | Function::Floor | Function::Ceil | Function::Round => (first_type, any_null),
        Function::Sha256 => (DataType::Text { length: Some(64), fixed: true }, any_null),
    };
    let arguments = arguments.into_iter().map(|(node, _, _)| node).collect();
    Ok((Node::Call { function, arguments }, data_type, nullable))
}

/// The type of a text function's result: the argument's text type when it is one.
fn text_like(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Text { length, .. } => DataType::Text { length: *length, fixed: false },
        _ => DataType::Text { length: None, fixed: false },
    }
}

fn signed(data_type: DataType) -> DataType {
    match data_type {
        DataType::Integer { .. } => DataType::Integer { bytes: 8, unsigned: false },
        other => other,
    }
}

/// The common type of several results, NULL literals aside (their type is whatever the others
/// are).
fn common_types<'a>(results: impl Iterator<Item = (&'a Node, DataType)>) -> DataType {
    results
        .filter(|(node, _)| !matches!(node, Node::Literal(Value::Null)))
        .map(|(_, data_type)| data_type)
        .reduce(common_type)
        .unwrap_or(DataType::Text { length: None, fixed: false })
}

fn is_integer(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Integer { .. } | DataType::Year | DataType::Boolean | DataType::Bits { .. })
}

fn arithmetic_type(operation: Arithmetic, left: &DataType, right: &DataType) -> DataType {
    let float = |data_type: &DataType| matches!(data_type, DataType::Float32 | DataType::Float64);
    if float(left) || float(right) {
        return DataType::Float64;
    }
    if operation != Arithmetic::Divide && is_integer(left) && is_integer(right) {
        return DataType::Integer { bytes: 8, unsigned: false };
    }
    let unconstrained = |data_type: &DataType| matches!(data_type, DataType::Decimal { scale: None, .. });
    if unconstrained(left) || unconstrained(right) {
        // A source numeric without a declared scale (PostgreSQL numeric, SQLite NUMERIC).
        return DataType::Decimal { precision: None, scale: None };
    }
    let scale = |data_type: &DataType| match data_type {
        DataType::Decimal { scale, .. } => scale.unwrap_or(0),
        _ => 0,
    };
    let scale = match operation {
        Arithmetic::Multiply => scale(left) + scale(right),
        Arithmetic::Divide => scale(left) + DIVISION_SCALE,
        _ => scale(left).max(scale(right)),
    };
    if scale > 30 {
        // More digits after the point than MySQL's DECIMAL holds: keep them all.
        return DataType::Decimal { precision: None, scale: None };
    }
    DataType::Decimal { precision: Some(65), scale: Some(scale) }
}

/// Digits a division adds to its dividend's scale (MySQL's `div_precision_increment`).
const DIVISION_SCALE: u32 = 4;

fn common_type(left: DataType, right: DataType) -> DataType {
    if left == right {
        return left;
    }
    match (&left, &right) {
        (DataType::Text { length: a, .. }, DataType::Text { length: b, .. }) => {
            DataType::Text { length: a.zip(*b).map(|(a, b)| a.max(b)), fixed: false }
        }
        (a, b) if is_integer(a) && is_integer(b) => DataType::Integer { bytes: 8, unsigned: false },
        (DataType::Decimal { .. }, other) | (other, DataType::Decimal { .. })
            if !matches!(
                other,
                DataType::Text { .. }
                    | DataType::Date
                    | DataType::DateTime { .. }
                    | DataType::Timestamp { .. }
                    | DataType::Time { .. }
                    | DataType::Json
            ) =>
        {
            arithmetic_type(Arithmetic::Add, &left, &right)
        }
        (DataType::Float32 | DataType::Float64, b) | (b, DataType::Float32 | DataType::Float64) if is_integer(b) => {
            DataType::Float64
        }
        _ => DataType::Text { length: None, fixed: false },
    }
}

/// The type a `CAST` names.
fn data_type(to: &sql::DataType) -> Result<DataType, String> {
    use sql::DataType as T;
    let integer = |bytes: u8, unsigned: bool| DataType::Integer { bytes, unsigned };
    let length = |length: &Option<sql::CharacterLength>| match length {
        Some(sql::CharacterLength::IntegerLength { length, .. }) => Some(*length as u32),
        _ => None,
    };
    let exact = |info: &sql::ExactNumberInfo| match info {
        sql::ExactNumberInfo::None => DataType::Decimal { precision: Some(65), scale: Some(0) },
        sql::ExactNumberInfo::Precision(precision) => {
            DataType::Decimal { precision: Some(*precision as u32), scale: Some(0) }
        }
        sql::ExactNumberInfo::PrecisionAndScale(precision, scale) => {
            DataType::Decimal { precision: Some(*precision as u32), scale: Some((*scale).max(0) as u32) }
        }
    };
    let precision = |precision: &Option<u64>| precision.map_or(0, |precision| precision.min(6) as u8);
    Ok(match to {
        T::TinyInt(_) => integer(1, false),
        T::TinyIntUnsigned(_) | T::UTinyInt | T::UInt8 => integer(1, true),
        T::SmallInt(_) | T::Int2(_) | T::Int16 => integer(2, false),
        T::SmallIntUnsigned(_) | T::Int2Unsigned(_) | T::USmallInt | T::UInt16 => integer(2, true),
        T::MediumInt(_) => integer(3, false),
        T::MediumIntUnsigned(_) => integer(3, true),
        T::Int(_) | T::Int4(_) | T::Integer(_) | T::Int32 => integer(4, false),
        T::IntUnsigned(_) | T::Int4Unsigned(_) | T::IntegerUnsigned(_) | T::UInt32 => integer(4, true),
        T::BigInt(_) | T::Int8(_) | T::Int64 | T::Signed | T::SignedInteger => integer(8, false),
        T::BigIntUnsigned(_) | T::UBigInt | T::Int8Unsigned(_) | T::UInt64 | T::Unsigned | T::UnsignedInteger => {
            integer(8, true)
        }
        T::Numeric(info) | T::Decimal(info) | T::Dec(info) => exact(info),
        T::Float(sql::ExactNumberInfo::Precision(bits)) if *bits <= 24 => DataType::Float32,
        T::Real | T::Float4 | T::Float32 => DataType::Float32,
        T::Float(_) | T::Double(_) | T::DoublePrecision | T::Float8 | T::Float64 => DataType::Float64,
        T::Char(size) | T::Character(size) => DataType::Text { length: length(size), fixed: true },
        T::Varchar(size) | T::CharacterVarying(size) | T::CharVarying(size) | T::Nvarchar(size) => {
            DataType::Text { length: length(size), fixed: false }
        }
        T::Text | T::TinyText | T::MediumText | T::LongText | T::String(None) => {
            DataType::Text { length: None, fixed: false }
        }
        T::Binary(size) => DataType::Bytes { length: size.map(|size| size as u32), fixed: true },
        T::Varbinary(_) | T::Bytea | T::Blob(_) | T::TinyBlob | T::MediumBlob | T::LongBlob | T::Bytes(_) => {
            DataType::Bytes { length: None, fixed: false }
        }
        T::Bool | T::Boolean => DataType::Boolean,
        T::Date => DataType::Date,
        T::Time(size, _) => DataType::Time { precision: precision(size) },
        T::Datetime(size) => DataType::DateTime { precision: precision(size) },
        T::Timestamp(size, _) => DataType::Timestamp { precision: precision(size) },
        T::JSON | T::JSONB => DataType::Json,
        other => return Err(format!("CAST to `{other}` is not supported in a transform")),
    })
}

/// SQL's truth of a value: NULL is unknown; numbers are true when not zero (MySQL's booleans
/// are integers).
fn truth(value: &Value) -> Option<bool> {
    match value {
        Value::Null => None,
        Value::Bool(value) => Some(*value),
        Value::Int(value) => Some(*value != 0),
        Value::UInt(value) => Some(*value != 0),
        Value::Bits { value, .. } => Some(*value != 0),
        Value::Float32(value) => Some(*value != 0.0),
        Value::Float64(value) => Some(*value != 0.0),
        Value::Decimal(value) => Some(value.as_str().bytes().any(|byte| matches!(byte, b'1'..=b'9'))),
        Value::Text(text) => Some(text.trim().parse::<f64>().is_ok_and(|number| number != 0.0)),
        _ => Some(true),
    }
}

fn boolean(value: Option<bool>) -> Value {
    value.map_or(Value::Null, Value::Bool)
}

/// The columns `node` reads, each once.
fn columns_read(node: &Node, read: &mut Vec<usize>) {
    let mut visit = |inner: &Node| columns_read(inner, read);
    match node {
        Node::Column(index) => {
            if !read.contains(index) {
                read.push(*index);
            }
        }
        Node::Literal(_) => {}
        Node::Not(inner)
        | Node::Negate(inner)
        | Node::IsNull { node: inner, .. }
        | Node::IsTruth { node: inner, .. } => visit(inner),
        Node::Cast { node: inner, .. } => visit(inner),
        Node::And(left, right)
        | Node::Or(left, right)
        | Node::Compare(_, left, right)
        | Node::Arithmetic(_, left, right)
        | Node::Concat(left, right) => {
            visit(left);
            visit(right);
        }
        Node::In { node: inner, list, .. } => {
            visit(inner);
            list.iter().for_each(&mut visit);
        }
        Node::Between { node: inner, low, high, .. } => {
            visit(inner);
            visit(low);
            visit(high);
        }
        Node::Like { node: inner, pattern, .. } => {
            visit(inner);
            visit(pattern);
        }
        Node::Case { operand, branches, otherwise } => {
            operand.iter().for_each(|inner| visit(inner));
            for (when, then) in branches {
                visit(when);
                visit(then);
            }
            otherwise.iter().for_each(|inner| visit(inner));
        }
        Node::Call { arguments, .. } => arguments.iter().for_each(&mut visit),
    }
}

fn evaluate<'a>(node: &'a Node, row: &'a [Value]) -> Result<Cow<'a, Value>, String> {
    let owned = |value: Value| Ok(Cow::Owned(value));
    match node {
        Node::Column(index) => Ok(Cow::Borrowed(&row[*index])),
        Node::Literal(value) => Ok(Cow::Borrowed(value)),
        Node::Not(inner) => owned(boolean(truth(&*evaluate(inner, row)?).map(|value| !value))),
        Node::Negate(inner) => {
            let value = evaluate(inner, row)?;
            if value.is_null() {
                return owned(Value::Null);
            }
            owned(arithmetic(Arithmetic::Subtract, &Value::Int(0), &value)?)
        }
        Node::And(left, right) => {
            let left = truth(&*evaluate(left, row)?);
            if left == Some(false) {
                return owned(Value::Bool(false));
            }
            let right = truth(&*evaluate(right, row)?);
            owned(boolean(match (left, right) {
                (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            }))
        }
        Node::Or(left, right) => {
            let left = truth(&*evaluate(left, row)?);
            if left == Some(true) {
                return owned(Value::Bool(true));
            }
            let right = truth(&*evaluate(right, row)?);
            owned(boolean(match (left, right) {
                (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            }))
        }
        Node::Compare(comparison, left, right) => {
            let (left, right) = (evaluate(left, row)?, evaluate(right, row)?);
            owned(boolean(compare(&left, &right)?.map(|ordering| comparison.holds(ordering))))
        }
        Node::Arithmetic(operation, left, right) => {
            let (left, right) = (evaluate(left, row)?, evaluate(right, row)?);
            if left.is_null() || right.is_null() {
                return owned(Value::Null);
            }
            owned(arithmetic(*operation, &left, &right)?)
        }
        Node::Concat(left, right) => {
            let (left, right) = (evaluate(left, row)?, evaluate(right, row)?);
            if left.is_null() || right.is_null() {
                return owned(Value::Null);
            }
            owned(Value::Text(format!("{}{}", text_of(&left), text_of(&right))))
        }
        Node::IsNull { node, negated } => owned(Value::Bool(evaluate(node, row)?.is_null() != *negated)),
        Node::IsTruth { node, truth: wanted, negated } => {
            owned(Value::Bool((truth(&*evaluate(node, row)?) == Some(*wanted)) != *negated))
        }
        Node::In { node, list, negated } => {
            let value = evaluate(node, row)?;
            if value.is_null() {
                return owned(Value::Null);
            }
            let mut unknown = false;
            for item in list {
                match compare(&value, &*evaluate(item, row)?)? {
                    Some(Ordering::Equal) => return owned(Value::Bool(!negated)),
                    None => unknown = true,
                    Some(_) => {}
                }
            }
            owned(if unknown { Value::Null } else { Value::Bool(*negated) })
        }
        Node::Between { node, low, high, negated } => {
            let value = evaluate(node, row)?;
            let above = compare(&value, &*evaluate(low, row)?)?.map(|ordering| ordering != Ordering::Less);
            let below = compare(&value, &*evaluate(high, row)?)?.map(|ordering| ordering != Ordering::Greater);
            let inside = match (above, below) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            };
            owned(boolean(inside.map(|inside| inside != *negated)))
        }
        Node::Like { node, pattern, negated, case_insensitive } => {
            let (value, pattern) = (evaluate(node, row)?, evaluate(pattern, row)?);
            if value.is_null() || pattern.is_null() {
                return owned(Value::Null);
            }
            let (value, pattern) = (text_of(&value), text_of(&pattern));
            let matched = if *case_insensitive {
                like(&value.to_lowercase(), &pattern.to_lowercase())
            } else {
                like(&value, &pattern)
            };
            owned(Value::Bool(matched != *negated))
        }
        Node::Case { operand, branches, otherwise } => {
            let operand = operand.as_ref().map(|operand| evaluate(operand, row)).transpose()?;
            for (condition, result) in branches {
                let condition = evaluate(condition, row)?;
                let taken = match &operand {
                    Some(operand) => compare(operand, &condition)? == Some(Ordering::Equal),
                    None => truth(&condition) == Some(true),
                };
                if taken {
                    return evaluate(result, row);
                }
            }
            match otherwise {
                Some(otherwise) => evaluate(otherwise, row),
                None => owned(Value::Null),
            }
        }
        Node::Cast { node, to } => owned(cast(evaluate(node, row)?.into_owned(), to)?),
        Node::Call { function, arguments } => {
            let mut values = Vec::with_capacity(arguments.len());
            for argument in arguments {
                values.push(evaluate(argument, row)?);
            }
            owned(apply(*function, &values)?)
        }
    }
}

/// A value's text: text as it is, everything else as it displays.
pub fn text_of(value: &Value) -> Cow<'_, str> {
    match value {
        Value::Text(text) | Value::Json(text) => Cow::Borrowed(text),
        Value::Bytes(bytes) => String::from_utf8_lossy(bytes),
        other => Cow::Owned(other.to_string()),
    }
}

fn apply(function: Function, values: &[Cow<'_, Value>]) -> Result<Value, String> {
    let null_in = values.iter().any(|value| value.is_null());
    let strict = !matches!(function, Function::Coalesce | Function::ConcatWithSeparator | Function::NullIf);
    if strict && null_in {
        return Ok(Value::Null);
    }
    let text = |index: usize| text_of(&values[index]);
    let count = |index: usize| -> Result<i64, String> {
        match integer_of(&values[index]) {
            Some(number) => Ok(number),
            None => {
                Err(format!("{function:?} expects a whole number as argument {}, found {}", index + 1, values[index])
                    .to_lowercase())
            }
        }
    };
    Ok(match function {
        Function::Upper => Value::Text(text(0).to_uppercase()),
        Function::Lower => Value::Text(text(0).to_lowercase()),
        Function::Trim => Value::Text(text(0).trim_matches(' ').to_owned()),
        Function::LeftTrim => Value::Text(text(0).trim_start_matches(' ').to_owned()),
        Function::RightTrim => Value::Text(text(0).trim_end_matches(' ').to_owned()),
        Function::Length => Value::Int(text(0).chars().count() as i64),
        Function::OctetLength => Value::Int(match &*values[0] {
            Value::Bytes(bytes) => bytes.len() as i64,
            other => text_of(other).len() as i64,
        }),
        Function::Substring => {
            let source = text(0);
            let characters = source.chars().count() as i64;
            let start = count(1)?;
            // SQL positions are 1-based; a negative start counts from the end (MySQL).
            let from = match start {
                start if start > 0 => start - 1,
                start if start < 0 && -start <= characters => characters + start,
                // Before the start, or 0: nothing, as MySQL gives.
                _ => characters,
            };
            let length = if values.len() > 2 { count(2)?.max(0) } else { characters };
            Value::Text(source.chars().skip(from as usize).take(length as usize).collect())
        }
        Function::Left => Value::Text(text(0).chars().take(count(1)?.max(0) as usize).collect()),
        Function::Right => {
            let source = text(0);
            let take = count(1)?.max(0) as usize;
            let skip = source.chars().count().saturating_sub(take);
            Value::Text(source.chars().skip(skip).collect())
        }
        Function::Replace => {
            let (source, from, to) = (text(0), text(1), text(2));
            Value::Text(if from.is_empty() { source.into_owned() } else { source.replace(&*from, &to) })
        }
        Function::Concat => Value::Text(values.iter().map(|value| text_of(value)).collect()),
        Function::ConcatWithSeparator => {
            if values[0].is_null() {
                return Ok(Value::Null);
            }
            let separator = text(0);
            let parts: Vec<Cow<'_, str>> =
                values[1..].iter().filter(|value| !value.is_null()).map(|value| text_of(value)).collect();
            Value::Text(parts.join(&separator))
        }
        Function::Coalesce => {
            values.iter().find(|value| !value.is_null()).map_or(Value::Null, |value| (**value).clone())
        }
        Function::NullIf => {
            if compare(&values[0], &values[1])? == Some(Ordering::Equal) {
                Value::Null
            } else {
                (*values[0]).clone()
            }
        }
        Function::Abs => match &*values[0] {
            Value::UInt(value) => Value::UInt(*value),
            value if negative(value)? => arithmetic(Arithmetic::Subtract, &Value::Int(0), value)?,
            value => value.clone(),
        },
        Function::Round | Function::Floor | Function::Ceil => {
            let digits = if values.len() > 1 { count(1)? } else { 0 };
            round(function, &values[0], digits)?
        }
        Function::Sha256 => {
            use sha2::Digest;
            let digest = match &*values[0] {
                Value::Bytes(bytes) => sha2::Sha256::digest(bytes),
                other => sha2::Sha256::digest(text_of(other).as_bytes()),
            };
            Value::Text(hex(&digest))
        }
    })
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[(byte >> 4) as usize] as char);
        text.push(DIGITS[(byte & 15) as usize] as char);
    }
    text
}

fn negative(value: &Value) -> Result<bool, String> {
    Ok(match number(value)? {
        Number::Integer(value) => value < 0,
        Number::Float(value) => value < 0.0,
        Number::Decimal { mantissa, .. } => mantissa < 0,
    })
}

fn integer_of(value: &Value) -> Option<i64> {
    match number(value).ok()? {
        Number::Integer(value) => i64::try_from(value).ok(),
        Number::Decimal { mantissa, scale } if mantissa % 10i128.pow(scale) == 0 => {
            i64::try_from(mantissa / 10i128.pow(scale)).ok()
        }
        Number::Float(value) if value.fract() == 0.0 && value.abs() < 9.0e15 => Some(value as i64),
        _ => None,
    }
}

/// A number for arithmetic and comparison: integers, floats, and exact decimals as a scaled
/// 128-bit integer (38 digits, more than a MySQL DECIMAL(65) holds only for huge values, which
/// are an error here, never rounded).
#[derive(Debug, Clone, Copy)]
enum Number {
    Integer(i128),
    Float(f64),
    Decimal { mantissa: i128, scale: u32 },
}

fn number(value: &Value) -> Result<Number, String> {
    Ok(match value {
        Value::Int(value) => Number::Integer(i128::from(*value)),
        Value::UInt(value) => Number::Integer(i128::from(*value)),
        Value::Bool(value) => Number::Integer(i128::from(*value)),
        Value::Bits { value, .. } => Number::Integer(i128::from(*value)),
        Value::Float32(value) => Number::Float(f64::from(*value)),
        Value::Float64(value) => Number::Float(*value),
        Value::Decimal(decimal) => decimal_number(decimal.as_str())?,
        Value::Text(text) => match bounded_exponent(text).then(|| Decimal::parse(text)).flatten() {
            Some(decimal) => decimal_number(decimal.as_str())?,
            None => return Err(format!("'{}' is not a number", text.chars().take(64).collect::<String>())),
        },
        other => return Err(format!("{other} is not a number")),
    })
}

/// Whether a number's text has no exponent or a small one: `1e2000000000` would expand to two
/// gigabytes of digits.
fn bounded_exponent(text: &str) -> bool {
    match text.find(['e', 'E']) {
        None => true,
        Some(at) => text[at + 1..].trim().parse::<i32>().is_ok_and(|exponent| exponent.abs() <= 100),
    }
}

fn decimal_number(text: &str) -> Result<Number, String> {
    let too_large = || format!("{text} has too many digits for arithmetic in a transform (at most 38)");
    let (integer, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > MAX_DIGITS {
        return Err(too_large());
    }
    let digits = format!("{integer}{fraction}");
    let mantissa: i128 = digits.parse().map_err(|_| too_large())?;
    Ok(if fraction.is_empty() {
        Number::Integer(mantissa)
    } else {
        Number::Decimal { mantissa, scale: fraction.len() as u32 }
    })
}

/// Digits an i128 always holds: every scale a number here has is at most this, so every power
/// of ten of a scale fits.
const MAX_DIGITS: usize = 38;

fn scaled(mantissa: i128, from: u32, to: u32) -> Option<i128> {
    mantissa.checked_mul(10i128.checked_pow(to - from)?)
}

fn decimal_value(mantissa: i128, scale: u32) -> Value {
    let negative = mantissa < 0;
    let digits = mantissa.unsigned_abs().to_string();
    let digits = if digits.len() <= scale as usize {
        format!("{}{digits}", "0".repeat(scale as usize + 1 - digits.len()))
    } else {
        digits
    };
    let (integer, fraction) = digits.split_at(digits.len() - scale as usize);
    let text = if scale == 0 { integer.to_owned() } else { format!("{integer}.{fraction}") };
    let text = if negative { format!("-{text}") } else { text };
    Value::Decimal(Decimal::parse(&text).expect("a formatted decimal parses"))
}

fn as_float(number: Number) -> f64 {
    match number {
        Number::Integer(value) => value as f64,
        Number::Float(value) => value,
        Number::Decimal { mantissa, scale } => mantissa as f64 / 10f64.powi(scale as i32),
    }
}

fn as_decimal(number: Number) -> (i128, u32) {
    match number {
        Number::Integer(value) => (value, 0),
        Number::Decimal { mantissa, scale } => (mantissa, scale),
        Number::Float(_) => unreachable!("floats are handled before"),
    }
}

fn arithmetic(operation: Arithmetic, left: &Value, right: &Value) -> Result<Value, String> {
    let (a, b) = (number(left)?, number(right)?);
    let overflow = || format!("{left} {operation:?} {right} overflows").to_lowercase();
    if matches!(a, Number::Float(_)) || matches!(b, Number::Float(_)) {
        let (a, b) = (as_float(a), as_float(b));
        let result = match operation {
            Arithmetic::Add => a + b,
            Arithmetic::Subtract => a - b,
            Arithmetic::Multiply => a * b,
            Arithmetic::Divide if b == 0.0 => return Ok(Value::Null),
            Arithmetic::Divide => a / b,
            Arithmetic::Remainder if b == 0.0 => return Ok(Value::Null),
            Arithmetic::Remainder => a % b,
        };
        return Ok(Value::Float64(result));
    }
    if let (Number::Integer(a), Number::Integer(b), false) = (a, b, operation == Arithmetic::Divide) {
        let result = match operation {
            Arithmetic::Add => a.checked_add(b),
            Arithmetic::Subtract => a.checked_sub(b),
            Arithmetic::Multiply => a.checked_mul(b),
            Arithmetic::Remainder if b == 0 => return Ok(Value::Null),
            Arithmetic::Remainder => a.checked_rem(b),
            Arithmetic::Divide => unreachable!(),
        }
        .ok_or_else(overflow)?;
        // Integer arithmetic is BIGINT, as its column is typed.
        return i64::try_from(result).map(Value::Int).map_err(|_| overflow());
    }
    let ((a, a_scale), (b, b_scale)) = (as_decimal(a), as_decimal(b));
    let common = a_scale.max(b_scale);
    let (aligned_a, aligned_b) =
        (scaled(a, a_scale, common).ok_or_else(overflow)?, scaled(b, b_scale, common).ok_or_else(overflow)?);
    let (mantissa, scale) = match operation {
        Arithmetic::Add => (aligned_a.checked_add(aligned_b).ok_or_else(overflow)?, common),
        Arithmetic::Subtract => (aligned_a.checked_sub(aligned_b).ok_or_else(overflow)?, common),
        Arithmetic::Multiply => (a.checked_mul(b).ok_or_else(overflow)?, a_scale + b_scale),
        Arithmetic::Remainder if aligned_b == 0 => return Ok(Value::Null),
        Arithmetic::Remainder => (aligned_a.checked_rem(aligned_b).ok_or_else(overflow)?, common),
        Arithmetic::Divide if b == 0 => return Ok(Value::Null),
        Arithmetic::Divide => {
            // a / b with the dividend's scale plus four digits, rounded half away from zero.
            let scale = a_scale + DIVISION_SCALE;
            let numerator = scaled(a, a_scale, scale + b_scale + 1).ok_or_else(overflow)?;
            let quotient = numerator / b;
            let rounded = (quotient + if quotient < 0 { -5 } else { 5 }) / 10;
            (rounded, scale)
        }
    };
    Ok(decimal_value(mantissa, scale))
}

fn round(function: Function, value: &Value, digits: i64) -> Result<Value, String> {
    if digits < 0 {
        return round_to_tens(function, value, (-digits).min(38) as u32);
    }
    let digits = digits.min(30) as u32;
    Ok(match number(value)? {
        Number::Integer(_) => value.clone(),
        Number::Float(float) => {
            let factor = 10f64.powi(digits as i32);
            let shifted = float * factor;
            Value::Float64(
                match function {
                    Function::Floor => shifted.floor(),
                    Function::Ceil => shifted.ceil(),
                    _ => shifted.round(),
                } / factor,
            )
        }
        Number::Decimal { mantissa, scale } if scale <= digits => decimal_value(mantissa, scale),
        Number::Decimal { mantissa, scale } => {
            let unit = 10i128.pow(scale - digits);
            let (quotient, remainder) = (mantissa / unit, mantissa % unit);
            let adjusted = match function {
                Function::Floor if remainder < 0 => quotient - 1,
                Function::Ceil if remainder > 0 => quotient + 1,
                Function::Round if remainder.unsigned_abs() * 2 >= unit.unsigned_abs() => quotient + remainder.signum(),
                _ => quotient,
            };
            let value = decimal_value(adjusted, digits);
            match (function, digits, &value) {
                // FLOOR and CEIL of a decimal are whole numbers.
                (Function::Floor | Function::Ceil, 0, Value::Decimal(decimal)) => {
                    decimal.as_str().parse::<i64>().map_or(value.clone(), Value::Int)
                }
                _ => value,
            }
        }
    })
}

/// ROUND, FLOOR or CEIL to a multiple of 10^`power` (`ROUND(1234.5, -2)` = 1200).
fn round_to_tens(function: Function, value: &Value, power: u32) -> Result<Value, String> {
    let overflow = || format!("rounding {value} overflows");
    let unit = 10i128.pow(power);
    let (mantissa, scale) = match number(value)? {
        Number::Float(float) => {
            let unit = unit as f64;
            let shifted = float / unit;
            let whole = match function {
                Function::Floor => shifted.floor(),
                Function::Ceil => shifted.ceil(),
                _ => shifted.round(),
            };
            return Ok(Value::Float64(whole * unit));
        }
        number => as_decimal(number),
    };
    let units = unit.checked_mul(10i128.pow(scale)).ok_or_else(overflow)?;
    let (quotient, remainder) = (mantissa / units, mantissa % units);
    let adjusted = match function {
        Function::Floor if remainder < 0 => quotient - 1,
        Function::Ceil if remainder > 0 => quotient + 1,
        Function::Round if remainder.unsigned_abs() * 2 >= units.unsigned_abs() => quotient + remainder.signum(),
        _ => quotient,
    };
    let result = adjusted.checked_mul(unit).ok_or_else(overflow)?;
    Ok(match value {
        Value::Decimal(_) | Value::Text(_) => decimal_value(result, 0),
        _ => Value::Int(i64::try_from(result).map_err(|_| overflow())?),
    })
}

/// Compares two values; `None` when either is NULL. Numbers compare by value whatever their
/// types, text by code point, temporal values with text read as the same type.
pub fn compare(left: &Value, right: &Value) -> Result<Option<Ordering>, String> {
    use Value as V;
    if left.is_null() || right.is_null() {
        return Ok(None);
    }
    let cannot = || format!("cannot compare {left} with {right}");
    Ok(Some(match (left, right) {
        (V::Text(a) | V::Json(a), V::Text(b) | V::Json(b)) => a.as_str().cmp(b.as_str()),
        (V::Bytes(a), V::Bytes(b)) => a.cmp(b),
        (V::Bytes(a), V::Text(b)) => a.as_slice().cmp(b.as_bytes()),
        (V::Text(a), V::Bytes(b)) => a.as_bytes().cmp(b.as_slice()),
        (V::Date(a), V::Date(b)) => a.cmp(b),
        (V::DateTime(a) | V::Timestamp(a), V::DateTime(b) | V::Timestamp(b)) => a.cmp(b),
        (V::Date(a), V::DateTime(b) | V::Timestamp(b)) => midnight(*a).cmp(b),
        (V::DateTime(a) | V::Timestamp(a), V::Date(b)) => a.cmp(&midnight(*b)),
        (V::Time(a), V::Time(b)) => a.signed_microseconds().cmp(&b.signed_microseconds()),
        (V::Date(_) | V::DateTime(_) | V::Timestamp(_) | V::Time(_), V::Text(text)) => {
            return compare(left, &temporal_like(left, text).ok_or_else(cannot)?)
        }
        (V::Text(text), V::Date(_) | V::DateTime(_) | V::Timestamp(_) | V::Time(_)) => {
            return compare(&temporal_like(right, text).ok_or_else(cannot)?, right)
        }
        _ => {
            let (a, b) = (number(left).map_err(|_| cannot())?, number(right).map_err(|_| cannot())?);
            compare_numbers(a, b).ok_or_else(cannot)?
        }
    }))
}

fn midnight(date: Date) -> DateTime {
    DateTime { date, hour: 0, minute: 0, second: 0, microsecond: 0 }
}

/// Text read as the temporal type of `like`.
fn temporal_like(like: &Value, text: &str) -> Option<Value> {
    match like {
        Value::Date(_) => Date::parse(text).map(Value::Date).or_else(|| DateTime::parse(text).map(Value::DateTime)),
        Value::DateTime(_) => DateTime::parse(text).map(Value::DateTime),
        Value::Timestamp(_) => DateTime::parse(text.strip_suffix("+00:00").unwrap_or(text)).map(Value::Timestamp),
        Value::Time(_) => Time::parse(text).map(Value::Time),
        _ => None,
    }
}

fn compare_numbers(a: Number, b: Number) -> Option<Ordering> {
    match (a, b) {
        (Number::Integer(a), Number::Integer(b)) => Some(a.cmp(&b)),
        (Number::Float(_), _) | (_, Number::Float(_)) => as_float(a).partial_cmp(&as_float(b)),
        _ => {
            let ((a, a_scale), (b, b_scale)) = (as_decimal(a), as_decimal(b));
            let common = a_scale.max(b_scale);
            match (scaled(a, a_scale, common), scaled(b, b_scale, common)) {
                (Some(a), Some(b)) => Some(a.cmp(&b)),
                _ => as_float(Number::Decimal { mantissa: a, scale: a_scale })
                    .partial_cmp(&as_float(Number::Decimal { mantissa: b, scale: b_scale })),
            }
        }
    }
}

/// SQL LIKE: `%` any run, `_` one character, `\` escapes the next.
fn like(text: &str, pattern: &str) -> bool {
    let text: Vec<char> = text.chars().collect();
    let mut tokens: Vec<(char, bool)> = Vec::new();
    let mut characters = pattern.chars();
    while let Some(character) = characters.next() {
        match character {
            '\\' => tokens.push((characters.next().unwrap_or('\\'), true)),
            other => tokens.push((other, false)),
        }
    }
    // Iterative matching with backtracking to the last `%`.
    let (mut at, mut token) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while at < text.len() {
        match tokens.get(token) {
            Some(('%', false)) => {
                star = Some((token, at));
                token += 1;
            }
            Some(('_', false)) => {
                at += 1;
                token += 1;
            }
            Some((character, _)) if *character == text[at] => {
                at += 1;
                token += 1;
            }
            _ => match star {
                Some((star_token, star_at)) => {
                    token = star_token + 1;
                    at = star_at + 1;
                    star = Some((star_token, star_at + 1));
                }
                None => return false,
            },
        }
    }
    tokens[token..].iter().all(|token| *token == ('%', false))
}

/// Converts a value to `to` only when nothing is lost; anything else is an error naming both.
pub fn cast(value: Value, to: &DataType) -> Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    let lossy = |value: &Value| format!("CAST of {value} to {} would lose information", type_name(to));
    Ok(match to {
        DataType::Integer { bytes, unsigned } => {
            let integer: i128 = match number(&value) {
                Ok(Number::Integer(integer)) => integer,
                Ok(Number::Decimal { mantissa, scale }) if mantissa % 10i128.pow(scale) == 0 => {
                    mantissa / 10i128.pow(scale)
                }
                Ok(Number::Float(float)) if float.fract() == 0.0 && float.abs() < 1.8e19 => float as i128,
                _ => return Err(lossy(&value)),
            };
            let bits = u32::from(*bytes) * 8;
            let (low, high) =
                if *unsigned { (0, (1i128 << bits) - 1) } else { (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1) };
            if integer < low || integer > high {
                return Err(lossy(&value));
            }
            if *unsigned {
                Value::UInt(integer as u64)
            } else {
                Value::Int(integer as i64)
            }
        }
        DataType::Decimal { precision, scale } => {
            let (mantissa, from) = match number(&value) {
                Ok(Number::Float(float)) => {
                    match decimal_number(&Decimal::parse(&float.to_string()).ok_or_else(|| lossy(&value))?.to_string())
                    {
                        Ok(number) => as_decimal(number),
                        Err(_) => return Err(lossy(&value)),
                    }
                }
                Ok(number) => as_decimal(number),
                Err(_) => return Err(lossy(&value)),
            };
            let scale = scale.unwrap_or(from);
            let mantissa = if from > scale {
                let unit = 10i128.pow(from - scale);
                if mantissa % unit != 0 {
                    return Err(lossy(&value));
                }
                mantissa / unit
            } else {
                scaled(mantissa, from, scale).ok_or_else(|| lossy(&value))?
            };
            if let Some(precision) = precision {
                if mantissa.unsigned_abs().to_string().len() > *precision as usize {
                    return Err(lossy(&value));
                }
            }
            decimal_value(mantissa, scale)
        }
        DataType::Float32 | DataType::Float64 => {
            let float = match &value {
                Value::Float32(float) => f64::from(*float),
                Value::Float64(float) => *float,
                other => {
                    let number = number(other).map_err(|_| lossy(other))?;
                    let float = as_float(number);
                    // Lossless: the float reads back as the same number.
                    let back =
                        Decimal::parse(&float.to_string()).and_then(|decimal| decimal_number(decimal.as_str()).ok());
                    if back.and_then(|back| compare_numbers(back, number)) != Some(Ordering::Equal) {
                        return Err(lossy(other));
                    }
                    float
                }
            };
            if *to == DataType::Float32 {
                let single = float as f32;
                if f64::from(single) != float {
                    return Err(lossy(&value));
                }
                Value::Float32(single)
            } else {
                Value::Float64(float)
            }
        }
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => {
            let length = match to {
                DataType::Text { length, .. } => *length,
                _ => None,
            };
            let text = match value {
                Value::Text(text) => text,
                Value::Bytes(bytes) => {
                    String::from_utf8(bytes).map_err(|error| lossy(&Value::Bytes(error.into_bytes())))?
                }
                other => text_of(&other).into_owned(),
            };
            if length.is_some_and(|length| text.chars().count() > length as usize) {
                return Err(lossy(&Value::Text(text)));
            }
            Value::Text(text)
        }
        DataType::Bytes { length, .. } => {
            let bytes = match value {
                Value::Bytes(bytes) => bytes,
                Value::Text(text) => text.into_bytes(),
                other => return Err(lossy(&other)),
            };
            if length.is_some_and(|length| bytes.len() > length as usize) {
                return Err(lossy(&Value::Bytes(bytes)));
            }
            Value::Bytes(bytes)
        }
        DataType::Boolean => match &value {
            Value::Bool(_) => value,
            Value::Text(text) => match text.to_ascii_lowercase().as_str() {
                "true" | "t" | "1" => Value::Bool(true),
                "false" | "f" | "0" => Value::Bool(false),
                _ => return Err(lossy(&value)),
            },
            other => match integer_of(other) {
                Some(0) => Value::Bool(false),
                Some(1) => Value::Bool(true),
                _ => return Err(lossy(other)),
            },
        },
        DataType::Date => match &value {
            Value::Date(_) => value,
            Value::DateTime(time) | Value::Timestamp(time)
                if time.hour == 0 && time.minute == 0 && time.second == 0 && time.microsecond == 0 =>
            {
                Value::Date(time.date)
            }
            Value::Text(text) => Value::Date(Date::parse(text.trim()).ok_or_else(|| lossy(&value))?),
            other => return Err(lossy(other)),
        },
        DataType::DateTime { .. } | DataType::Timestamp { .. } => {
            let time = match &value {
                Value::DateTime(time) | Value::Timestamp(time) => *time,
                Value::Date(date) => midnight(*date),
                Value::Text(text) => {
                    let text = text.trim();
                    DateTime::parse(text.strip_suffix("+00:00").unwrap_or(text)).ok_or_else(|| lossy(&value))?
                }
                other => return Err(lossy(other)),
            };
            if matches!(to, DataType::Timestamp { .. }) {
                Value::Timestamp(time)
            } else {
                Value::DateTime(time)
            }
        }
        DataType::Time { .. } => match &value {
            Value::Time(_) => value,
            Value::Text(text) => Value::Time(Time::parse(text.trim()).ok_or_else(|| lossy(&value))?),
            other => return Err(lossy(other)),
        },
        DataType::Json => match &value {
            Value::Json(_) => value,
            Value::Text(text) if serde_json::from_str::<serde_json::Value>(text).is_ok() => Value::Json(text.clone()),
            other => return Err(lossy(other)),
        },
        DataType::Year | DataType::Bits { .. } | DataType::Geometry => {
            return Err(format!("CAST to {} is not supported in a transform", type_name(to)))
        }
    })
}

fn type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Integer { bytes, unsigned } => {
            let name = match bytes {
                1 => "TINYINT",
                2 => "SMALLINT",
                3 => "MEDIUMINT",
                4 => "INT",
                _ => "BIGINT",
            };
            if *unsigned {
                format!("{name} UNSIGNED")
            } else {
                name.to_owned()
            }
        }
        DataType::Decimal { precision, scale } => {
            format!("DECIMAL({},{})", precision.unwrap_or(65), scale.unwrap_or(0))
        }
        DataType::Text { length: Some(length), .. } => format!("VARCHAR({length})"),
        DataType::Text { .. } => "TEXT".into(),
        other => format!("{other:?}").to_uppercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Column;

    fn columns() -> Vec<Column> {
        vec![
            Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
            Column::new("name", DataType::Text { length: Some(40), fixed: false }, true),
            Column::new("price", DataType::Decimal { precision: Some(10), scale: Some(2) }, false),
            Column::new("born", DataType::Date, true),
        ]
    }

    fn row() -> Vec<Value> {
        vec![
            Value::Int(42),
            Value::Text("Ada Lovelace".into()),
            Value::Decimal(Decimal::parse("19.99").unwrap()),
            Value::Date(Date::parse("1815-12-10").unwrap()),
        ]
    }

    fn value_of(text: &str) -> Result<Value, String> {
        let columns = columns();
        let table = TableName::parse("shop.people");
        let parsed = parse_predicate(text)?;
        let expression = Expression::compile(&parsed, Scope { table: &table, columns: &columns })?;
        let row = row();
        expression.evaluate(&row).map(Cow::into_owned)
    }

    fn text(value: &str) -> Value {
        Value::Text(value.into())
    }

    #[test]
    fn expressions_evaluate_as_sql_does() {
        let decimal = |text: &str| Value::Decimal(Decimal::parse(text).unwrap());
        let cases: Vec<(&str, Value)> = vec![
            ("id + 1", Value::Int(43)),
            ("id * price", decimal("839.58")),
            ("price / 4", decimal("4.997500")),
            ("price - 0.5", decimal("19.49")),
            ("-id", Value::Int(-42)),
            ("id % 5", Value::Int(2)),
            ("upper(name)", text("ADA LOVELACE")),
            ("LOWER(`name`)", text("ada lovelace")),
            ("substring(name, 5)", text("Lovelace")),
            ("SUBSTRING(name FROM 1 FOR 3)", text("Ada")),
            ("left(name, 3) || '-' || right(name, 2)", text("Ada-ce")),
            ("concat(name, ' #', id)", text("Ada Lovelace #42")),
            ("concat_ws('/', name, NULL, 'x')", text("Ada Lovelace/x")),
            ("length(name)", Value::Int(12)),
            ("coalesce(NULL, name)", text("Ada Lovelace")),
            ("nullif(id, 42)", Value::Null),
            ("replace(name, 'a', 'A')", text("AdA LovelAce")),
            ("trim('  x  ')", text("x")),
            ("round(price, 1)", decimal("20.0")),
            ("floor(price)", Value::Int(19)),
            ("ceil(price)", Value::Int(20)),
            ("abs(-3)", Value::Int(3)),
            ("id > 10 AND name LIKE 'Ada%'", Value::Bool(true)),
            ("name NOT LIKE '%love%'", Value::Bool(true)),
            ("name ILIKE '%love%'", Value::Bool(true)),
            ("id IN (1, 2, 42)", Value::Bool(true)),
            ("id NOT IN (1, 2)", Value::Bool(true)),
            ("id IN (1, NULL)", Value::Null),
            ("price BETWEEN 10 AND 20", Value::Bool(true)),
            ("born < '1900-01-01'", Value::Bool(true)),
            ("born = DATE '1815-12-10'", Value::Bool(true)),
            ("NULL = NULL", Value::Null),
            ("name IS NOT NULL", Value::Bool(true)),
            ("NOT (id = 42) OR NULL", Value::Null),
            ("id = 42 OR NULL", Value::Bool(true)),
            ("CASE WHEN id > 100 THEN 'big' WHEN id > 10 THEN 'medium' ELSE 'small' END", text("medium")),
            ("CASE id WHEN 42 THEN 'answer' END", text("answer")),
            ("CAST(id AS VARCHAR(10))", text("42")),
            ("CAST('17' AS INT)", Value::Int(17)),
            ("CAST(price AS DECIMAL(12,4))", decimal("19.9900")),
            ("CAST(born AS DATETIME)", Value::DateTime(DateTime::parse("1815-12-10 00:00:00").unwrap())),
            ("__table_name__", text("people")),
            ("__schema_name__ || '.' || __table_name__", text("shop.people")),
            ("sha256('abc')", text("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")),
            ("1 / 0", Value::Null),
            ("1.5e3 + 1", Value::Float64(1501.0)),
        ];
        for (expression, expected) in cases {
            assert_eq!(value_of(expression), Ok(expected), "{expression}");
        }
    }

    #[test]
    fn a_cast_that_would_lose_information_is_an_error() {
        for lossy in [
            "CAST(price AS INT)",
            "CAST(300 AS TINYINT)",
            "CAST(-1 AS BIGINT UNSIGNED)",
            "CAST(name AS VARCHAR(3))",
            "CAST('12a' AS INT)",
            "CAST(price AS DECIMAL(10,1))",
            "CAST('2020-13-01' AS DATE)",
        ] {
            let error = value_of(lossy).unwrap_err();
            assert!(error.contains("would lose information"), "{lossy}: {error}");
        }
        assert_eq!(value_of("CAST(20 AS TINYINT UNSIGNED)"), Ok(Value::UInt(20)));
    }

    #[test]
    fn hostile_numbers_are_errors_not_panics() {
        let decimal = |text: &str| Value::Decimal(Decimal::parse(text).unwrap());
        for expression in [
            "CAST('1e-200' AS INT)",
            "round('1e-200')",
            "CAST(CAST('1e-90' AS DOUBLE) AS DECIMAL(10,2))",
            "'1e2000000000' + 1",
            "'-17014118346046923173168730371588410572.8' % -0.1",
            "9223372036854775807 + 1",
            "99999999999999999999999999999999999999 * 99999999999999999999999999999999999999",
        ] {
            assert!(value_of(expression).is_err(), "{expression}: {:?}", value_of(expression));
        }
        assert_eq!(value_of("round('0.99999999999999999999999999999999999999')"), Ok(decimal("1")));
        assert_eq!(value_of("round(1234.5, -2)"), Ok(decimal("1200")));
        assert_eq!(value_of("round(1250, -2)"), Ok(Value::Int(1300)));
        assert_eq!(value_of("round(-1250, -2)"), Ok(Value::Int(-1300)));
    }

    #[test]
    fn truth_tests_and_edges_follow_sql() {
        assert_eq!(value_of("2 IS TRUE"), Ok(Value::Bool(true)));
        assert_eq!(value_of("NULL IS NOT TRUE"), Ok(Value::Bool(true)));
        assert_eq!(value_of("0 IS FALSE"), Ok(Value::Bool(true)));
        assert_eq!(value_of("NULL IS FALSE"), Ok(Value::Bool(false)));
        assert_eq!(value_of("substring('abc', -5, 2)"), Ok(text("")));
        assert_eq!(value_of("substring('abc', -2)"), Ok(text("bc")));
        assert_eq!(value_of("substring('abc', 0)"), Ok(text("")));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let error = value_of("nme = 'x'").unwrap_err();
        assert!(error.contains("has no column `nme`") && error.contains("id, name, price, born"), "{error}");
        assert!(value_of("now()").unwrap_err().contains("unknown function `now`"));
        assert!(value_of("upper(name, id)").unwrap_err().contains("takes 1 argument"));
        assert!(value_of("id = (SELECT 1)").unwrap_err().contains("not supported"));
        assert!(parse_predicate("id > ").is_err());
        assert!(parse_predicate("id > 1 garbage").unwrap_err().contains("unexpected"));
        assert!(value_of("name > 5").unwrap_err().contains("cannot compare"));
    }

    #[test]
    fn types_are_inferred_for_the_target() {
        let columns = columns();
        let table = TableName::parse("shop.people");
        let scope = Scope { table: &table, columns: &columns };
        let type_of = |text: &str| {
            let expression = Expression::compile(&parse_predicate(text).unwrap(), scope).unwrap();
            (expression.data_type, expression.nullable)
        };
        assert_eq!(type_of("id"), (DataType::Integer { bytes: 8, unsigned: false }, false));
        assert_eq!(type_of("trim(name)"), (DataType::Text { length: Some(40), fixed: false }, true));
        assert_eq!(type_of("price * 2"), (DataType::Decimal { precision: Some(65), scale: Some(2) }, false));
        assert_eq!(type_of("CAST(id AS CHAR(8))"), (DataType::Text { length: Some(8), fixed: true }, false));
        assert_eq!(type_of("id > 3"), (DataType::Boolean, false));
        assert_eq!(type_of("sha256(name)"), (DataType::Text { length: Some(64), fixed: true }, true));
        assert_eq!(
            type_of("CASE WHEN id > 1 THEN id ELSE NULL END"),
            (DataType::Integer { bytes: 8, unsigned: false }, true)
        );
        assert_eq!(
            type_of("CASE WHEN id > 1 THEN price ELSE 'n/a' END").0,
            DataType::Text { length: None, fixed: false }
        );
        assert_eq!(type_of("upper(name)").0, DataType::Text { length: None, fixed: false });
    }

    #[test]
    fn like_patterns_match_as_sql_does() {
        assert!(like("abc", "a%"));
        assert!(like("abc", "%c"));
        assert!(like("abc", "a_c"));
        assert!(!like("abc", "a_"));
        assert!(like("a%c", "a\\%c"));
        assert!(!like("abc", "a\\%c"));
        assert!(like("", "%"));
        assert!(like("mississippi", "%iss%ppi"));
        assert!(!like("mississippi", "%iss%ppx"));
    }

    #[test]
    fn projections_parse_with_aliases_and_wildcards() {
        assert_eq!(parse_projection("id, name AS customer, upper(email) email").unwrap().len(), 3);
        assert_eq!(parse_projection("* EXCEPT (secret), 1 AS one").unwrap().len(), 2);
        assert!(parse_projection("id,").is_err());
    }
}
