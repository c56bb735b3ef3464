//! Label and field selectors, parsed and matched like
//! `k8s.io/apimachinery/pkg/labels` and `.../fields` so that a selector the
//! real apiserver rejects is rejected here too (with 400), and one it accepts
//! selects the same pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// A selector that could not be parsed; the message is sent in a 400 Status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// The operator of one label requirement (`selection.Operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `k=v` / `k==v` / `k in (a,b)`: the label is present with one of the values.
    In,
    /// `k!=v` / `k notin (a,b)`: the label is absent or has none of the values.
    NotIn,
    /// `k`: the label is present.
    Exists,
    /// `!k`: the label is absent.
    DoesNotExist,
    /// `k>n`: the label is an integer greater than n.
    GreaterThan,
    /// `k<n`: the label is an integer less than n.
    LessThan,
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// How the key's value is tested.
    pub operator: Operator,
    /// Values for `In`/`NotIn` (one for `=`/`!=`), or the integer for `>`/`<`.
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether a label set satisfies this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(value), Some(bound)) = (value, self.values.first()) else {
                    return false;
                };
                let (Ok(value), Ok(bound)) = (value.parse::<i64>(), bound.parse::<i64>()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    value > bound
                } else {
                    value < bound
                }
            }
        }
    }
}

/// A parsed label selector: all requirements must hold (comma means AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// The requirements, in the order written.
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        Parser::new(input).parse()
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether a label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Identifier(String),
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    GreaterThan,
    LessThan,
    OpenPar,
    ClosePar,
    Comma,
    End,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Identifier(s) => s.clone(),
            Token::Bang => "!".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::GreaterThan => ">".into(),
            Token::LessThan => "<".into(),
            Token::OpenPar => "(".into(),
            Token::ClosePar => ")".into(),
            Token::Comma => ",".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '<' | '>')
}

fn lex(input: &str) -> Vec<Token> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).copied();
        let (token, len) = match (c, next) {
            ('!', Some('=')) => (Token::NotEquals, 2),
            ('!', _) => (Token::Bang, 1),
            ('=', Some('=')) => (Token::DoubleEquals, 2),
            ('=', _) => (Token::Equals, 1),
            ('(', _) => (Token::OpenPar, 1),
            (')', _) => (Token::ClosePar, 1),
            (',', _) => (Token::Comma, 1),
            ('<', _) => (Token::LessThan, 1),
            ('>', _) => (Token::GreaterThan, 1),
            _ => {
                let start = i;
                let mut end = i;
                while end < chars.len() && !chars[end].is_whitespace() && !is_special(chars[end]) {
                    end += 1;
                }
                let word: String = chars[start..end].iter().collect();
                let token = match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier(word),
                };
                (token, end - start)
            }
        };
        tokens.push(token);
        i += len;
    }
    tokens.push(Token::End);
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn new(input: &str) -> Self {
        Self {
            tokens: lex(input),
            pos: 0,
        }
    }

    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    fn parse(mut self) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            match self.peek() {
                Token::Identifier(_) | Token::Bang => {
                    requirements.push(self.requirement()?);
                    match self.next() {
                        Token::End => break,
                        Token::Comma => {
                            if !matches!(self.peek(), Token::Identifier(_) | Token::Bang) {
                                return Err(SelectorError(format!(
                                    "found '{}', expected: identifier after ','",
                                    self.peek().describe()
                                )));
                            }
                        }
                        other => {
                            return Err(SelectorError(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                other.describe()
                            )));
                        }
                    }
                }
                Token::End => break,
                other => {
                    return Err(SelectorError(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.describe()
                    )));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let negated = if self.peek() == &Token::Bang {
            self.next();
            true
        } else {
            false
        };
        let key = match self.next() {
            Token::Identifier(key) => key,
            other => {
                return Err(SelectorError(format!(
                    "found '{}', expected: identifier",
                    other.describe()
                )));
            }
        };
        validate_key(&key)?;
        if matches!(self.peek(), Token::End | Token::Comma) {
            let operator = if negated {
                Operator::DoesNotExist
            } else {
                Operator::Exists
            };
            return Ok(Requirement {
                key,
                operator,
                values: Vec::new(),
            });
        }
        if negated {
            return Err(SelectorError(format!(
                "found '{}', expected: ',' or 'end of string'",
                self.peek().describe()
            )));
        }
        let (operator, values) = match self.next() {
            Token::Equals | Token::DoubleEquals => (Operator::In, vec![self.exact_value()?]),
            Token::NotEquals => (Operator::NotIn, vec![self.exact_value()?]),
            Token::GreaterThan => (Operator::GreaterThan, vec![self.exact_value()?]),
            Token::LessThan => (Operator::LessThan, vec![self.exact_value()?]),
            Token::In => (Operator::In, self.value_set()?),
            Token::NotIn => (Operator::NotIn, self.value_set()?),
            other => {
                return Err(SelectorError(format!(
                    "found '{}', expected: [!= = == > < in notin]",
                    other.describe()
                )));
            }
        };
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    return Err(SelectorError(
                        "for 'in', 'notin' operators, values set can't be empty".into(),
                    ));
                }
                for v in &values {
                    validate_value(v)?;
                }
            }
            _ => {
                if values.iter().any(|v| v.parse::<i64>().is_err()) {
                    return Err(SelectorError(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer: {:?}",
                        values
                    )));
                }
            }
        }
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    fn exact_value(&mut self) -> Result<String, SelectorError> {
        match self.peek().clone() {
            Token::End | Token::Comma => Ok(String::new()),
            other => match value_text(&other) {
                Some(v) => {
                    self.next();
                    Ok(v)
                }
                None => Err(SelectorError(format!(
                    "found '{}', expected: identifier",
                    other.describe()
                ))),
            },
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Token::OpenPar => {}
            other => {
                return Err(SelectorError(format!(
                    "found '{}', expected: '('",
                    other.describe()
                )));
            }
        }
        let mut values = Vec::new();
        if self.peek() == &Token::ClosePar {
            self.next();
            return Ok(values);
        }
        loop {
            let token = self.next();
            if let Some(v) = value_text(&token) {
                values.push(v);
                match self.next() {
                    Token::Comma => continue,
                    Token::ClosePar => return Ok(values),
                    other => {
                        return Err(SelectorError(format!(
                            "found '{}', expected: ',' or ')'",
                            other.describe()
                        )));
                    }
                }
            }
            match token {
                // An empty element, as in `(a,,b)` or `(a,)`.
                Token::Comma => values.push(String::new()),
                Token::ClosePar => {
                    values.push(String::new());
                    return Ok(values);
                }
                other => {
                    return Err(SelectorError(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        other.describe()
                    )));
                }
            }
        }
    }
}

/// In value position the keywords `in` and `notin` are plain values, as in
/// the apimachinery lexer's `Values` context.
fn value_text(token: &Token) -> Option<String> {
    match token {
        Token::Identifier(v) => Some(v.clone()),
        Token::In => Some("in".to_owned()),
        Token::NotIn => Some("notin".to_owned()),
        _ => None,
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// `validation.IsQualifiedName`'s name part and `IsValidLabelValue`.
fn is_label_name(s: &str, allow_empty: bool) -> bool {
    if s.is_empty() {
        return allow_empty;
    }
    s.len() <= 63
        && s.starts_with(is_alnum)
        && s.ends_with(is_alnum)
        && s.chars()
            .all(|c| is_alnum(c) || c == '-' || c == '_' || c == '.')
}

/// `validation.IsDNS1123Subdomain`.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(is_dns_subdomain);
    if prefix_ok && is_label_name(name, false) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// Whether `key` is a valid label key (optional DNS prefix + name).
pub(crate) fn is_label_key(key: &str) -> bool {
    validate_key(key).is_ok()
}

/// Whether `value` is a valid label value (may be empty).
pub(crate) fn is_label_value(value: &str) -> bool {
    is_label_name(value, true)
}

fn validate_value(value: &str) -> Result<(), SelectorError> {
    if is_label_name(value, true) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// One `field=value` / `field!=value` term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field label, e.g. `metadata.name`.
    pub field: String,
    /// The value compared with.
    pub value: String,
    /// `!=` instead of `=`/`==`.
    pub negated: bool,
}

/// A parsed field selector, restricted to the field labels pods support.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// The terms; all must hold.
    pub terms: Vec<FieldTerm>,
}

/// The field labels the apiserver accepts for pods (`pod.ToSelectableFields`
/// plus the generic `metadata.name`/`metadata.namespace`).
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter (with `\` escapes).
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for raw in split_unescaped(input, ',') {
            if raw.trim().is_empty() {
                continue;
            }
            let (field, value, negated) = split_field_term(&raw).ok_or_else(|| {
                SelectorError(format!(
                    "invalid selector: '{input}'; can't understand '{raw}'"
                ))
            })?;
            let field = field.trim().to_owned();
            if !POD_FIELDS.contains(&field.as_str()) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            terms.push(FieldTerm {
                field,
                value: unescape(&value),
                negated,
            });
        }
        Ok(Self { terms })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether a pod's selectable fields satisfy every term.
    pub fn matches(&self, pod: &Pod) -> bool {
        self.terms.iter().all(|term| {
            let actual = pod_field(pod, &term.field);
            (actual == term.value) != term.negated
        })
    }
}

fn pod_field(pod: &Pod, field: &str) -> String {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let text = |v: Option<&String>| v.cloned().unwrap_or_default();
    match field {
        "metadata.name" => text(pod.metadata.name.as_ref()),
        "metadata.namespace" => text(pod.metadata.namespace.as_ref()),
        "spec.nodeName" => text(spec.and_then(|s| s.node_name.as_ref())),
        "spec.restartPolicy" => text(spec.and_then(|s| s.restart_policy.as_ref())),
        "spec.schedulerName" => text(spec.and_then(|s| s.scheduler_name.as_ref())),
        "spec.serviceAccountName" => text(spec.and_then(|s| s.service_account_name.as_ref())),
        "spec.hostNetwork" => spec
            .and_then(|s| s.host_network)
            .unwrap_or(false)
            .to_string(),
        "status.phase" => text(status.and_then(|s| s.phase.as_ref())),
        "status.podIP" => text(status.and_then(|s| s.pod_ip.as_ref())),
        "status.nominatedNodeName" => text(status.and_then(|s| s.nominated_node_name.as_ref())),
        _ => String::new(),
    }
}

/// Splits on `sep` unless it is escaped with a backslash (escapes are kept).
fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            current.push('\\');
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    if escaped {
        current.push('\\');
    }
    parts.push(current);
    parts
}

/// Finds the first unescaped operator of a field term.
fn split_field_term(term: &str) -> Option<(String, String, bool)> {
    let chars: Vec<char> = term.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '!' if chars.get(i + 1) == Some(&'=') => {
                return Some((
                    chars[..i].iter().collect(),
                    chars[i + 2..].iter().collect(),
                    true,
                ));
            }
            '=' => {
                let skip = if chars.get(i + 1) == Some(&'=') { 2 } else { 1 };
                return Some((
                    chars[..i].iter().collect(),
                    chars[i + skip..].iter().collect(),
                    false,
                ));
            }
            _ => i += 1,
        }
    }
    None
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn equality_forms() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        assert!(sel("app=web").matches(&l));
        assert!(sel("app==web").matches(&l));
        assert!(!sel("app=db").matches(&l));
        assert!(sel("app!=db").matches(&l));
        assert!(!sel("app!=web").matches(&l));
        // != matches when the label is absent, like the real selector.
        assert!(sel("missing!=x").matches(&l));
        assert!(!sel("missing=x").matches(&l));
    }

    #[test]
    fn existence_and_sets() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        assert!(sel("app").matches(&l));
        assert!(!sel("!app").matches(&l));
        assert!(sel("!nope").matches(&l));
        assert!(sel("app in (db, web)").matches(&l));
        assert!(!sel("app in (db,cache)").matches(&l));
        assert!(sel("app notin (db,cache)").matches(&l));
        assert!(!sel("app notin (web)").matches(&l));
        assert!(sel("nope notin (web)").matches(&l));
        assert!(!sel("nope in (web)").matches(&l));
    }

    #[test]
    fn conjunction_and_whitespace() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        assert!(sel(" app = web , tier in (front) , !canary ").matches(&l));
        assert!(!sel("app=web,tier=back").matches(&l));
        assert!(sel("").matches(&l));
        assert!(sel("").is_empty());
    }

    #[test]
    fn empty_value_and_prefixed_keys() {
        let l = labels(&[("example.com/role", ""), ("app", "web")]);
        assert!(sel("example.com/role=").matches(&l));
        assert!(sel("example.com/role").matches(&l));
        assert!(!sel("app=").matches(&l));
    }

    #[test]
    fn numeric_comparisons() {
        let l = labels(&[("weight", "10")]);
        assert!(sel("weight>5").matches(&l));
        assert!(!sel("weight<5").matches(&l));
        assert!(LabelSelector::parse("weight>abc").is_err());
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        for bad in [
            "app=web,",
            ",app",
            "app in",
            "app in ()",
            "app in (a",
            "app in a,b",
            "app=web=x",
            "=web",
            "!",
            "!app=web",
            "app web",
            "-bad=x",
            "app=-bad",
            "app notin",
            "a/b/c=d",
            "UPPER.example.com/x=y",
            "(app)",
        ] {
            assert!(
                LabelSelector::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn field_selectors() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .unwrap();
        let f = |s: &str| FieldSelector::parse(s).unwrap();
        assert!(f("metadata.name=web-1").matches(&pod));
        assert!(f("metadata.name==web-1,status.phase=Running").matches(&pod));
        assert!(!f("metadata.name=web-2").matches(&pod));
        assert!(f("metadata.name!=web-2").matches(&pod));
        assert!(f("spec.nodeName=node-a").matches(&pod));
        assert!(f("status.podIP=10.0.0.1").matches(&pod));
        assert!(f("spec.hostNetwork=false").matches(&pod));
        assert!(f("").matches(&pod));
        assert!(FieldSelector::parse("metadata.labels=x").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
