//! Label and field selectors, parsed and evaluated the way kube-apiserver does for `list` and `watch`.
//!
//! [`LabelSelector`] understands the `labelSelector` query parameter (`app=web,tier in (a,b),!canary`),
//! [`FieldSelector`] the `fieldSelector` query parameter (`spec.nodeName=node-1,status.phase!=Failed`),
//! and [`label_selector_matches`] evaluates the structured `metav1.LabelSelector` that Deployments,
//! Services, PodDisruptionBudgets and friends carry in their specs.
//!
//! Parsing fails with a [`SelectorError`] whose message quotes the whole selector text and names the
//! offending part, so a client sees which query parameter was rejected (kube-apiserver answers such
//! requests with `400 Bad Request`). Matching never fails: a selector that parsed matches or it does not.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as K8sLabelSelector, LabelSelectorRequirement as K8sLabelSelectorRequirement,
};
use serde_json::{Map, Value};

/// Why a `labelSelector` or `fieldSelector` query parameter was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement has no key (`=web`, `!`).
    #[error("unable to parse label selector {selector:?}: a requirement has an empty label key")]
    EmptyKey {
        /// The whole selector text.
        selector: String,
    },
    /// A label requirement uses an operator other than `=`, `==`, `!=`, `in` or `notin` (`k>v`).
    #[error(
        "unable to parse label selector {selector:?}: unknown operator {operator:?} after key {key:?} \
         (expected =, ==, !=, in or notin)"
    )]
    UnknownOperator {
        /// The whole selector text.
        selector: String,
        /// The label key the operator follows.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// Parentheses do not pair up (`k in (a,b`).
    #[error("unable to parse label selector {selector:?}: unbalanced parentheses")]
    UnbalancedParentheses {
        /// The whole selector text.
        selector: String,
    },
    /// `in` or `notin` is not followed by a parenthesised set (`k in a`).
    #[error(
        "unable to parse label selector {selector:?}: operator {operator:?} after key {key:?} \
         must be followed by a parenthesised set of values"
    )]
    MissingSet {
        /// The whole selector text.
        selector: String,
        /// The label key.
        key: String,
        /// `in` or `notin`.
        operator: String,
    },
    /// `in` or `notin` is followed by `()`.
    #[error("unable to parse label selector {selector:?}: the set of values for key {key:?} can't be empty")]
    EmptySet {
        /// The whole selector text.
        selector: String,
        /// The label key.
        key: String,
    },
    /// A token appeared where the grammar does not allow it (`a=b c`, `a=b,`).
    #[error("unable to parse label selector {selector:?}: found {found}, expected {expected}")]
    Unexpected {
        /// The whole selector text.
        selector: String,
        /// The token found, quoted, or `end of string`.
        found: String,
        /// What the grammar allows at that point.
        expected: &'static str,
    },
    /// A field selector term has no `=`, `==` or `!=`.
    #[error(
        "unable to parse field selector {selector:?}: {term:?} is not of the form \
         path=value, path==value or path!=value"
    )]
    InvalidFieldTerm {
        /// The whole selector text.
        selector: String,
        /// The offending term.
        term: String,
    },
    /// A field selector term has an empty path or an empty path segment (`=x`, `spec..nodeName=x`).
    #[error("unable to parse field selector {selector:?}: {term:?} has an empty field path or path segment")]
    InvalidFieldPath {
        /// The whole selector text.
        selector: String,
        /// The offending term.
        term: String,
    },
    /// A field selector value has a bad escape sequence or an unescaped `=`.
    #[error("unable to parse field selector {selector:?}: the value in {term:?} {reason}")]
    InvalidFieldValue {
        /// The whole selector text.
        selector: String,
        /// The offending term.
        term: String,
        /// What is wrong with the value.
        reason: &'static str,
    },
}

/// The operator of one parsed label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LabelOperator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One comma-separated requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    operator: LabelOperator,
    /// One value for `=`/`!=`, the set for `in`/`notin`, none for existence checks.
    values: Vec<String>,
}

impl LabelRequirement {
    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let present = labels.and_then(|labels| labels.get(&self.key));
        match self.operator {
            LabelOperator::Exists => present.is_some(),
            LabelOperator::DoesNotExist => present.is_none(),
            LabelOperator::Equals | LabelOperator::In => present
                .and_then(Value::as_str)
                .is_some_and(|value| self.values.iter().any(|wanted| wanted == value)),
            LabelOperator::NotEquals | LabelOperator::NotIn => match present {
                None => true,
                Some(Value::String(value)) => !self.values.contains(value),
                Some(_) => false,
            },
        }
    }
}

/// A parsed `labelSelector` query parameter: the conjunction of its requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter syntax: comma-separated requirements
    /// `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist).
    /// Whitespace around tokens is allowed. Empty string = matches everything.
    ///
    /// `k=` selects objects whose label `k` is the empty string. Keys and values are validated
    /// loosely: a key must be non-empty, but its characters are not checked against the label
    /// syntax rules.
    ///
    /// # Errors
    ///
    /// A [`SelectorError`] naming the selector text for an empty key, an unknown operator
    /// (`k>v`), unbalanced parentheses, `in`/`notin` without a set or with an empty set, or a stray
    /// token.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let tokens = tokenize(text);
        check_parentheses(text, &tokens)?;
        let mut parser = Parser {
            selector: text,
            tokens,
            pos: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(parser.requirement()?);
            match parser.advance() {
                None => break,
                Some(Token::Comma) => {}
                Some(other) => return Err(parser.unexpected(Some(&other), "',' or end of string")),
            }
        }
        Ok(Self { requirements })
    }

    /// Whether an object with these `metadata.labels` satisfies every requirement.
    ///
    /// `None` (no labels at all) behaves like an empty map. Label values that are not JSON strings
    /// never satisfy `=`, `!=`, `in` or `notin`; they do count as present for `k` and `!k`.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| requirement.matches(labels))
    }

    /// Whether the selector has no requirements (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// A lexical token of the label selector syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Eq,
    DoubleEq,
    NotEq,
    Not,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

impl Token {
    /// The token as written.
    fn text(&self) -> String {
        match self {
            Token::Ident(ident) => ident.clone(),
            Token::Eq => "=".to_owned(),
            Token::DoubleEq => "==".to_owned(),
            Token::NotEq => "!=".to_owned(),
            Token::Not => "!".to_owned(),
            Token::In => "in".to_owned(),
            Token::NotIn => "notin".to_owned(),
            Token::Open => "(".to_owned(),
            Token::Close => ")".to_owned(),
            Token::Comma => ",".to_owned(),
            Token::Gt => ">".to_owned(),
            Token::Lt => "<".to_owned(),
        }
    }
}

/// Characters that end an identifier.
fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '<' | '>')
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '=' => {
                if chars.next_if_eq(&'=').is_some() {
                    Token::DoubleEq
                } else {
                    Token::Eq
                }
            }
            '!' => {
                if chars.next_if_eq(&'=').is_some() {
                    Token::NotEq
                } else {
                    Token::Not
                }
            }
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            '<' => Token::Lt,
            '>' => Token::Gt,
            first => {
                let mut ident = String::from(first);
                while let Some(next) = chars.next_if(|&next| !next.is_whitespace() && !is_special(next)) {
                    ident.push(next);
                }
                match ident.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(ident),
                }
            }
        };
        tokens.push(token);
    }
    tokens
}

fn check_parentheses(selector: &str, tokens: &[Token]) -> Result<(), SelectorError> {
    let mut depth = 0_usize;
    for token in tokens {
        match token {
            Token::Open => depth += 1,
            Token::Close => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| SelectorError::UnbalancedParentheses {
                        selector: selector.to_owned(),
                    })?;
            }
            _ => {}
        }
    }
    if depth == 0 {
        Ok(())
    } else {
        Err(SelectorError::UnbalancedParentheses {
            selector: selector.to_owned(),
        })
    }
}

/// A recursive-descent parser over the tokens of one label selector.
struct Parser<'a> {
    selector: &'a str,
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn advance(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        if token.is_some() {
            self.pos += 1;
        }
        token
    }

    fn unexpected(&self, found: Option<&Token>, expected: &'static str) -> SelectorError {
        SelectorError::Unexpected {
            selector: self.selector.to_owned(),
            found: found.map_or_else(
                || "end of string".to_owned(),
                |token| format!("'{}'", token.text()),
            ),
            expected,
        }
    }

    fn empty_key(&self) -> SelectorError {
        SelectorError::EmptyKey {
            selector: self.selector.to_owned(),
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        let key = match self.advance() {
            Some(Token::Ident(key)) => key,
            Some(Token::Not) => return self.does_not_exist(),
            Some(Token::Eq | Token::DoubleEq | Token::NotEq) => return Err(self.empty_key()),
            other => return Err(self.unexpected(other.as_ref(), "a label key or '!'")),
        };
        let operator = match self.peek().cloned() {
            None | Some(Token::Comma) => {
                return Ok(LabelRequirement {
                    key,
                    operator: LabelOperator::Exists,
                    values: Vec::new(),
                });
            }
            Some(Token::Eq | Token::DoubleEq) => LabelOperator::Equals,
            Some(Token::NotEq) => LabelOperator::NotEquals,
            Some(Token::In) => LabelOperator::In,
            Some(Token::NotIn) => LabelOperator::NotIn,
            Some(other @ (Token::Gt | Token::Lt | Token::Not | Token::Ident(_))) => {
                return Err(SelectorError::UnknownOperator {
                    selector: self.selector.to_owned(),
                    key,
                    operator: other.text(),
                });
            }
            Some(other) => return Err(self.unexpected(Some(&other), "an operator")),
        };
        self.pos += 1;
        let values = match operator {
            LabelOperator::In => self.value_set(&key, "in")?,
            LabelOperator::NotIn => self.value_set(&key, "notin")?,
            _ => vec![self.exact_value()?],
        };
        Ok(LabelRequirement {
            key,
            operator,
            values,
        })
    }

    /// `!key`, after the `!` was consumed.
    fn does_not_exist(&mut self) -> Result<LabelRequirement, SelectorError> {
        let key = match self.advance() {
            Some(Token::Ident(key)) => key,
            None | Some(Token::Comma) => return Err(self.empty_key()),
            Some(other) => return Err(self.unexpected(Some(&other), "a label key after '!'")),
        };
        match self.peek() {
            None | Some(Token::Comma) => Ok(LabelRequirement {
                key,
                operator: LabelOperator::DoesNotExist,
                values: Vec::new(),
            }),
            Some(other) => Err(self.unexpected(Some(other), "',' or end of string after '!key'")),
        }
    }

    /// The value after `=`, `==` or `!=`; nothing before `,` or the end means the empty value.
    fn exact_value(&mut self) -> Result<String, SelectorError> {
        match self.peek().cloned() {
            None | Some(Token::Comma) => Ok(String::new()),
            Some(token @ (Token::Ident(_) | Token::In | Token::NotIn)) => {
                self.pos += 1;
                Ok(token.text())
            }
            Some(other) => Err(self.unexpected(Some(&other), "a label value")),
        }
    }

    /// The `(a, b)` after `in` or `notin`.
    fn value_set(&mut self, key: &str, operator: &str) -> Result<Vec<String>, SelectorError> {
        if self.peek() != Some(&Token::Open) {
            return Err(SelectorError::MissingSet {
                selector: self.selector.to_owned(),
                key: key.to_owned(),
                operator: operator.to_owned(),
            });
        }
        self.pos += 1;
        if self.peek() == Some(&Token::Close) {
            return Err(SelectorError::EmptySet {
                selector: self.selector.to_owned(),
                key: key.to_owned(),
            });
        }
        let mut values = Vec::new();
        loop {
            match self.peek().cloned() {
                Some(token @ (Token::Ident(_) | Token::In | Token::NotIn)) => {
                    self.pos += 1;
                    values.push(token.text());
                }
                Some(Token::Comma | Token::Close) => values.push(String::new()),
                other => return Err(self.unexpected(other.as_ref(), "a label value")),
            }
            match self.advance() {
                Some(Token::Comma) => {}
                Some(Token::Close) => return Ok(values),
                other => return Err(self.unexpected(other.as_ref(), "',' or ')'")),
            }
        }
    }
}

/// How one field selector term compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldOperator {
    Equals,
    NotEquals,
}

/// One comma-separated term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    path: Vec<String>,
    operator: FieldOperator,
    value: String,
}

impl FieldTerm {
    fn matches(&self, object: &Value) -> bool {
        let actual = field_text(object, &self.path);
        let equal = *actual == *self.value;
        match self.operator {
            FieldOperator::Equals => equal,
            FieldOperator::NotEquals => !equal,
        }
    }
}

/// The text a field compares as: strings as themselves, missing fields and `null` as the empty
/// string, anything else as its JSON text.
fn field_text<'v>(object: &'v Value, path: &[String]) -> Cow<'v, str> {
    match path
        .iter()
        .try_fold(object, |current, segment| current.get(segment.as_str()))
    {
        None | Some(Value::Null) => Cow::Borrowed(""),
        Some(Value::String(text)) => Cow::Borrowed(text),
        Some(other) => Cow::Owned(other.to_string()),
    }
}

/// A parsed `fieldSelector` query parameter: the conjunction of its terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses `fieldSelector`: comma-separated `path=value`, `path==value`, `path!=value`.
    /// Paths are dotted JSON paths into the object (metadata.name, metadata.namespace,
    /// spec.nodeName, status.phase, involvedObject.uid, ...). Values may use backslash escapes for
    /// `,` `=` `\`.
    ///
    /// Empty terms (`a=b,,c=d`, a trailing comma) are ignored, and an empty string selects
    /// everything. Whitespace around a term and around its path is ignored; the value is kept as
    /// written.
    ///
    /// # Errors
    ///
    /// A [`SelectorError`] naming the selector text and the term when a term has no operator, an
    /// empty path (segment), an unknown escape sequence, a trailing backslash or an unescaped `=` in
    /// its value.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for raw in split_unescaped(text, ',') {
            let term = raw.trim();
            if term.is_empty() {
                continue;
            }
            let (path, operator, value) =
                split_term(term).ok_or_else(|| SelectorError::InvalidFieldTerm {
                    selector: text.to_owned(),
                    term: term.to_owned(),
                })?;
            let path = path.trim();
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(SelectorError::InvalidFieldPath {
                    selector: text.to_owned(),
                    term: term.to_owned(),
                });
            }
            let value = unescape_value(value).map_err(|reason| SelectorError::InvalidFieldValue {
                selector: text.to_owned(),
                term: term.to_owned(),
                reason,
            })?;
            terms.push(FieldTerm {
                path: path.split('.').map(str::to_owned).collect(),
                operator,
                value,
            });
        }
        Ok(Self { terms })
    }

    /// A missing field compares as the empty string (so `spec.nodeName=` selects unbound pods);
    /// numbers and booleans compare by their JSON text.
    ///
    /// `null` also compares as the empty string; objects and arrays compare by their JSON text.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|term| term.matches(object))
    }

    /// Whether the selector has no terms (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// Splits on `separator` where it is not preceded by an escaping backslash.
fn split_unescaped(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == separator {
            parts.push(&text[start..index]);
            start = index + c.len_utf8();
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Splits a term at its first unescaped operator, trying `!=`, `==` and `=` at each position.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    let mut escaped = false;
    for (index, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        let rest = &term[index..];
        match c {
            '\\' => escaped = true,
            '!' if rest.starts_with("!=") => {
                return Some((&term[..index], FieldOperator::NotEquals, &rest[2..]));
            }
            '=' if rest.starts_with("==") => {
                return Some((&term[..index], FieldOperator::Equals, &rest[2..]));
            }
            '=' => return Some((&term[..index], FieldOperator::Equals, &rest[1..])),
            _ => {}
        }
    }
    None
}

/// Resolves `\,`, `\=` and `\\` in a field selector value.
fn unescape_value(value: &str) -> Result<String, &'static str> {
    let mut unescaped = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('\\' | ',' | '=')) => unescaped.push(escaped),
                Some(_) => return Err("has an invalid escape sequence (only \\\\, \\, and \\= are allowed)"),
                None => return Err("ends with a lone backslash"),
            },
            '=' => return Err("has an unescaped '=' (write \\=)"),
            other => unescaped.push(other),
        }
    }
    Ok(unescaped)
}

/// metav1.LabelSelector semantics (matchLabels AND matchExpressions with In, NotIn, Exists, DoesNotExist).
/// An empty selector matches everything. An unknown operator matches nothing.
///
/// An expression Kubernetes would reject (`In`/`NotIn` without values, `Exists`/`DoesNotExist` with
/// values) also matches nothing, as the selector cannot be converted. `NotIn` matches objects that
/// lack the label.
pub fn label_selector_matches(selector: &K8sLabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    labels_match
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|expression| expression_matches(expression, labels))
}

fn expression_matches(expression: &K8sLabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = expression.values.as_deref().unwrap_or_default();
    let value = labels.get(&expression.key);
    match expression.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|value| values.contains(value)),
        "NotIn" => !values.is_empty() && value.is_none_or(|value| !values.contains(value)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), Value::String((*value).to_owned())))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .expect("selector parses")
            .matches(Some(&labels(pairs)))
    }

    fn fields(selector: &str, object: &Value) -> bool {
        FieldSelector::parse(selector)
            .expect("selector parses")
            .matches(object)
    }

    fn k8s_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    fn expression(key: &str, operator: &str, values: Option<&[&str]>) -> K8sLabelSelectorRequirement {
        K8sLabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: values.map(|values| values.iter().map(|value| (*value).to_owned()).collect()),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let selector = LabelSelector::parse("").expect("empty parses");
        assert!(selector.is_empty());
        assert!(selector.matches(None));
        assert!(selector.matches(Some(&labels(&[("app", "web")]))));
        assert!(LabelSelector::parse("   ").expect("blank parses").is_empty());
    }

    #[test]
    fn equality_operators() {
        assert!(selects("app=web", &[("app", "web")]));
        assert!(selects("app==web", &[("app", "web")]));
        assert!(!selects("app=web", &[("app", "api")]));
        assert!(!selects("app=web", &[]));
        assert!(!LabelSelector::parse("app=web").expect("parses").is_empty());
    }

    #[test]
    fn not_equals_matches_objects_without_the_label() {
        assert!(selects("app!=web", &[("app", "api")]));
        assert!(selects("app!=web", &[]));
        assert!(!selects("app!=web", &[("app", "web")]));
        assert!(LabelSelector::parse("app!=web").expect("parses").matches(None));
    }

    #[test]
    fn set_operators() {
        assert!(selects("tier in (frontend,backend)", &[("tier", "backend")]));
        assert!(!selects("tier in (frontend,backend)", &[("tier", "db")]));
        assert!(!selects("tier in (frontend,backend)", &[]));
        assert!(selects("tier notin (db)", &[("tier", "frontend")]));
        assert!(selects("tier notin (db)", &[]));
        assert!(!selects("tier notin (db, cache)", &[("tier", "cache")]));
    }

    #[test]
    fn existence_operators() {
        assert!(selects("canary", &[("canary", "")]));
        assert!(!selects("canary", &[("app", "web")]));
        assert!(selects("!canary", &[("app", "web")]));
        assert!(!selects("!canary", &[("canary", "true")]));
        assert!(LabelSelector::parse("!canary").expect("parses").matches(None));
        assert!(!LabelSelector::parse("canary").expect("parses").matches(None));
    }

    #[test]
    fn requirements_are_anded_and_whitespace_is_allowed() {
        let selector = "  app = web ,  tier  in ( frontend , backend ) , !canary ";
        assert!(selects(selector, &[("app", "web"), ("tier", "frontend")]));
        assert!(!selects(
            selector,
            &[("app", "web"), ("tier", "frontend"), ("canary", "1")]
        ));
        assert!(!selects(selector, &[("app", "api"), ("tier", "frontend")]));
    }

    #[test]
    fn empty_value_selects_empty_label() {
        assert!(selects("app=", &[("app", "")]));
        assert!(!selects("app=", &[("app", "web")]));
        assert!(selects("app=,tier=db", &[("app", ""), ("tier", "db")]));
    }

    #[test]
    fn keys_with_prefixes_and_keyword_values() {
        assert!(selects(
            "app.kubernetes.io/name=nginx",
            &[("app.kubernetes.io/name", "nginx")]
        ));
        assert!(selects("mode=in", &[("mode", "in")]));
        assert!(selects("mode in (notin, out)", &[("mode", "notin")]));
    }

    #[test]
    fn non_string_label_values_never_match_value_operators() {
        let mut weird = Map::new();
        weird.insert("replicas".to_owned(), json!(3));
        for selector in [
            "replicas=3",
            "replicas!=3",
            "replicas in (3)",
            "replicas notin (4)",
        ] {
            assert!(
                !LabelSelector::parse(selector)
                    .expect("parses")
                    .matches(Some(&weird)),
                "{selector}"
            );
        }
        assert!(
            LabelSelector::parse("replicas")
                .expect("parses")
                .matches(Some(&weird))
        );
    }

    #[test]
    fn unknown_operator_names_selector() {
        let error = LabelSelector::parse("app>1").expect_err("> is rejected");
        assert_eq!(
            error,
            SelectorError::UnknownOperator {
                selector: "app>1".to_owned(),
                key: "app".to_owned(),
                operator: ">".to_owned(),
            }
        );
        assert!(error.to_string().contains("\"app>1\""), "{error}");
        assert!(matches!(
            LabelSelector::parse("app exists"),
            Err(SelectorError::UnknownOperator { operator, .. }) if operator == "exists"
        ));
    }

    #[test]
    fn set_syntax_errors() {
        assert_eq!(
            LabelSelector::parse("tier in (a,b"),
            Err(SelectorError::UnbalancedParentheses {
                selector: "tier in (a,b".to_owned()
            })
        );
        assert_eq!(
            LabelSelector::parse("tier in a,b)"),
            Err(SelectorError::UnbalancedParentheses {
                selector: "tier in a,b)".to_owned()
            })
        );
        assert_eq!(
            LabelSelector::parse("tier in ()"),
            Err(SelectorError::EmptySet {
                selector: "tier in ()".to_owned(),
                key: "tier".to_owned()
            })
        );
        assert_eq!(
            LabelSelector::parse("tier notin"),
            Err(SelectorError::MissingSet {
                selector: "tier notin".to_owned(),
                key: "tier".to_owned(),
                operator: "notin".to_owned(),
            })
        );
        assert!(matches!(
            LabelSelector::parse("tier in a"),
            Err(SelectorError::MissingSet { .. })
        ));
    }

    #[test]
    fn structural_errors() {
        assert_eq!(
            LabelSelector::parse("=web"),
            Err(SelectorError::EmptyKey {
                selector: "=web".to_owned()
            })
        );
        assert_eq!(
            LabelSelector::parse("!"),
            Err(SelectorError::EmptyKey {
                selector: "!".to_owned()
            })
        );
        assert!(matches!(
            LabelSelector::parse("app=web,"),
            Err(SelectorError::Unexpected { .. })
        ));
        assert!(matches!(
            LabelSelector::parse("app=web tier=db"),
            Err(SelectorError::Unexpected { .. })
        ));
        assert!(matches!(
            LabelSelector::parse("!app=web"),
            Err(SelectorError::Unexpected { .. })
        ));
        let error = LabelSelector::parse("app=(web)").expect_err("parenthesised value is rejected");
        assert!(error.to_string().contains("app=(web)"), "{error}");
    }

    #[test]
    fn field_selector_unbound_pods() {
        let unbound = json!({"metadata": {"name": "a"}, "spec": {"containers": []}});
        let bound = json!({"metadata": {"name": "b"}, "spec": {"nodeName": "node-1"}});
        assert!(fields("spec.nodeName=", &unbound));
        assert!(!fields("spec.nodeName=", &bound));
        assert!(fields("spec.nodeName!=", &bound));
        assert!(fields("spec.nodeName=node-1", &bound));
        assert!(!fields("spec.nodeName=node-2", &bound));
    }

    #[test]
    fn field_selector_namespace_not_equals() {
        let system = json!({"metadata": {"name": "coredns", "namespace": "kube-system"}});
        let app = json!({"metadata": {"name": "web", "namespace": "default"}});
        assert!(!fields("metadata.namespace!=kube-system", &system));
        assert!(fields("metadata.namespace!=kube-system", &app));
        assert!(fields("metadata.namespace==default,metadata.name=web", &app));
        assert!(!fields("metadata.namespace==default,metadata.name=api", &app));
    }

    #[test]
    fn field_selector_scalars_compare_by_json_text() {
        let node = json!({"spec": {"unschedulable": true}, "status": {"replicas": 3, "phase": null}});
        assert!(fields("spec.unschedulable=true", &node));
        assert!(!fields("spec.unschedulable=false", &node));
        assert!(fields("status.replicas=3", &node));
        assert!(fields("status.phase=", &node));
    }

    #[test]
    fn field_selector_escapes_and_empty_terms() {
        let event = json!({"involvedObject": {"name": "a,b=c\\d"}});
        assert!(fields(r"involvedObject.name=a\,b\=c\\d", &event));
        assert!(fields(r" involvedObject.name=a\,b\=c\\d ,", &event));
        let empty = FieldSelector::parse("").expect("empty parses");
        assert!(empty.is_empty());
        assert!(empty.matches(&event));
        assert!(
            !FieldSelector::parse("metadata.name=x")
                .expect("parses")
                .is_empty()
        );
    }

    #[test]
    fn field_selector_errors_name_the_selector() {
        let error = FieldSelector::parse("metadata.name").expect_err("no operator");
        assert_eq!(
            error,
            SelectorError::InvalidFieldTerm {
                selector: "metadata.name".to_owned(),
                term: "metadata.name".to_owned(),
            }
        );
        assert!(error.to_string().contains("metadata.name"), "{error}");
        assert!(matches!(
            FieldSelector::parse("=x"),
            Err(SelectorError::InvalidFieldPath { .. })
        ));
        assert!(matches!(
            FieldSelector::parse("spec..nodeName=x"),
            Err(SelectorError::InvalidFieldPath { .. })
        ));
        assert!(matches!(
            FieldSelector::parse(r"metadata.name=a\b"),
            Err(SelectorError::InvalidFieldValue { .. })
        ));
        assert!(matches!(
            FieldSelector::parse(r"metadata.name=a\"),
            Err(SelectorError::InvalidFieldValue { .. })
        ));
        assert!(matches!(
            FieldSelector::parse("metadata.name=a=b"),
            Err(SelectorError::InvalidFieldValue { .. })
        ));
    }

    #[test]
    fn structured_selector_match_labels_and_expressions() {
        let selector = K8sLabelSelector {
            match_labels: Some(k8s_labels(&[("app", "web")])),
            match_expressions: Some(vec![
                expression("tier", "In", Some(&["frontend", "backend"])),
                expression("track", "NotIn", Some(&["canary"])),
                expression("team", "Exists", None),
                expression("legacy", "DoesNotExist", None),
            ]),
        };
        assert!(label_selector_matches(
            &selector,
            &k8s_labels(&[("app", "web"), ("tier", "frontend"), ("team", "a")])
        ));
        assert!(!label_selector_matches(
            &selector,
            &k8s_labels(&[("app", "api"), ("tier", "frontend"), ("team", "a")])
        ));
        assert!(!label_selector_matches(
            &selector,
            &k8s_labels(&[
                ("app", "web"),
                ("tier", "frontend"),
                ("team", "a"),
                ("track", "canary")
            ])
        ));
        assert!(!label_selector_matches(
            &selector,
            &k8s_labels(&[("app", "web"), ("tier", "frontend")])
        ));
        assert!(!label_selector_matches(
            &selector,
            &k8s_labels(&[
                ("app", "web"),
                ("tier", "frontend"),
                ("team", "a"),
                ("legacy", "1")
            ])
        ));
    }

    #[test]
    fn structured_selector_empty_and_invalid() {
        assert!(label_selector_matches(
            &K8sLabelSelector::default(),
            &k8s_labels(&[])
        ));
        assert!(label_selector_matches(
            &K8sLabelSelector::default(),
            &k8s_labels(&[("app", "web")])
        ));
        let unknown = K8sLabelSelector {
            match_expressions: Some(vec![expression("app", "Gt", Some(&["1"]))]),
            ..K8sLabelSelector::default()
        };
        assert!(!label_selector_matches(&unknown, &k8s_labels(&[("app", "2")])));
        let not_in_without_values = K8sLabelSelector {
            match_expressions: Some(vec![expression("app", "NotIn", Some(&[]))]),
            ..K8sLabelSelector::default()
        };
        assert!(!label_selector_matches(
            &not_in_without_values,
            &k8s_labels(&[("app", "web")])
        ));
    }
}
