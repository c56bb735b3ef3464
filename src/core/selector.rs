//! The equality label selector of the `tgsync/selector` tag.
//!
//! AWS tag values cannot hold commas or parentheses, so terms are separated by spaces and
//! only `key=value` and bare `key` (exists) are supported. Keys and values are checked
//! against Kubernetes' label syntax up front, so a typo is a binding error on the group
//! rather than a selector that silently matches nothing.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Term {
    /// `key=value`: the label is present with exactly this value.
    Equals {
        /// Label key.
        key: String,
        /// Required value (may be empty, as Kubernetes allows).
        value: String,
    },
    /// `key`: the label is present, whatever its value.
    Exists {
        /// Label key.
        key: String,
    },
}

impl Term {
    /// The label key this term tests.
    pub fn key(&self) -> &str {
        match self {
            Self::Equals { key, .. } | Self::Exists { key } => key,
        }
    }
}

/// A pod's labels as a small vector: cheaper to build and search than a map for the
/// handful of labels a pod carries, which matters across 100,000 pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    /// The value of `key`, if the label is present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All labels, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl Labels {
    /// Labels from the entries of a JSON object in document order, giving exactly what
    /// decoding the object into a `BTreeMap` and converting it would (what k8s-openapi
    /// does): sorted by key, and for a key given twice the later value wins. Lets a lean
    /// decoder skip the map; the API server sends labels sorted, so usually nothing moves.
    pub fn from_object_entries(mut entries: Vec<(String, String)>) -> Self {
        if entries.windows(2).all(|w| w[0].0 < w[1].0) {
            return Self(entries);
        }
        // Stable: entries with the same key stay in document order, and the last one is kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<(String, String)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match unique.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => unique.push(entry),
            }
        }
        Self(unique)
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map.into_iter().collect())
    }
}

impl FromIterator<(String, String)> for Labels {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut v: Vec<(String, String)> = iter.into_iter().collect();
        v.sort();
        v.dedup_by(|a, b| a.0 == b.0);
        Self(v)
    }
}

/// A conjunction of [`Term`]s; an empty selector is never valid (it would match every pod
/// of the namespace, which is almost always a mistake in a tag).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    terms: Vec<Term>,
}

/// Why a `tgsync/selector` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorError {
    /// The tag holds no terms.
    #[error("selector is empty; give at least one `key=value` or `key` term")]
    Empty,
    /// A term is not `key=value` or `key`, or uses an operator tgsync does not support.
    #[error("selector term `{term}` is not valid: {reason}")]
    BadTerm {
        /// The term as written.
        term: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Selector {
    /// Parses the space-separated form of the `tgsync/selector` tag.
    pub fn parse(value: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for raw in value.split_whitespace() {
            terms.push(parse_term(raw)?);
        }
        if terms.is_empty() {
            return Err(SelectorError::Empty);
        }
        terms.sort_by(|a, b| a.key().cmp(b.key()).then_with(|| a.cmp(b)));
        terms.dedup();
        Ok(Self { terms })
    }

    /// The terms shared by every selector given: a LIST filtered by them returns a superset
    /// of what each selects, so one LIST can serve every group of a namespace. `None` when
    /// they share no term (list the whole namespace) or none is given.
    pub fn common<'a>(mut selectors: impl Iterator<Item = &'a Selector>) -> Option<Selector> {
        let mut terms = selectors.next()?.terms.clone();
        for s in selectors {
            terms.retain(|t| s.terms.contains(t));
        }
        (!terms.is_empty()).then_some(Selector { terms })
    }

    /// Whether a LIST filtered by `self` returns every pod `other` selects: each of
    /// `self`'s terms is one of `other`'s (as [`Selector::common`]'s result is of each).
    pub fn covers(&self, other: &Selector) -> bool {
        self.terms.iter().all(|t| other.terms.contains(t))
    }

    /// The terms, sorted and de-duplicated.
    pub fn terms(&self) -> &[Term] {
        &self.terms
    }

    /// Whether a pod with these labels is selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.terms.iter().all(|term| match term {
            Term::Equals { key, value } => labels.get(key) == Some(value.as_str()),
            Term::Exists { key } => labels.get(key).is_some(),
        })
    }

    /// The Kubernetes `labelSelector` query form (`a=b,c`), for server-side filtering.
    pub fn to_query(&self) -> String {
        let parts: Vec<String> = self
            .terms
            .iter()
            .map(|t| match t {
                Term::Equals { key, value } => format!("{key}={value}"),
                Term::Exists { key } => key.clone(),
            })
            .collect();
        parts.join(",")
    }
}

/// The tag form, space separated.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            match t {
                Term::Equals { key, value } => write!(f, "{key}={value}")?,
                Term::Exists { key } => f.write_str(key)?,
            }
        }
        Ok(())
    }
}

fn parse_term(raw: &str) -> Result<Term, SelectorError> {
    let bad = |reason: &str| SelectorError::BadTerm {
        term: raw.to_owned(),
        reason: reason.to_owned(),
    };
    if raw.contains("!=") || raw.starts_with('!') {
        return Err(bad(
            "negation is not supported; tgsync selectors are equality terms only",
        ));
    }
    if raw.contains("==") {
        return Err(bad("write `key=value` with a single `=`"));
    }
    match raw.split_once('=') {
        Some((key, value)) => {
            check_key(key).map_err(|r| bad(&r))?;
            check_value(value).map_err(|r| bad(&r))?;
            Ok(Term::Equals {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        }
        None => {
            check_key(raw).map_err(|r| bad(&r))?;
            Ok(Term::Exists {
                key: raw.to_owned(),
            })
        }
    }
}

/// Label keys: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix))
    {
        return Err(format!(
            "label key prefix `{prefix}` must be a lowercase DNS subdomain"
        ));
    }
    if name.is_empty() {
        return Err("label key name is empty".into());
    }
    check_name_like(name, "label key name")
}

/// Label values: empty, or at most 63 characters of the same alphabet as key names.
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name_like(value, "label value")
}

fn check_name_like(s: &str, what: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("{what} `{s}` is longer than 63 characters"));
    }
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    let ok_inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let first_last_ok = bytes.first().is_some_and(alnum) && bytes.last().is_some_and(alnum);
    if !first_last_ok || !bytes.iter().all(ok_inner) {
        return Err(format!(
            "{what} `{s}` must start and end with a letter or digit and contain only letters, digits, `-`, `_` and `.`"
        ));
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn object_entries_give_what_a_btreemap_gives() {
        let cases: [&[(&str, &str)]; 4] = [
            &[],
            &[("app", "web"), ("tier", "front")],
            &[("tier", "front"), ("app", "web"), ("app", "api")],
            &[("b", "1"), ("a", "2"), ("b", "0"), ("a", "1"), ("c", "")],
        ];
        for entries in cases {
            let owned: Vec<(String, String)> = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let map: BTreeMap<String, String> = owned.iter().cloned().collect();
            assert_eq!(
                Labels::from_object_entries(owned),
                Labels::from(map),
                "{entries:?}"
            );
        }
    }

    #[test]
    fn parses_equality_and_exists_terms() {
        let s = Selector::parse("app.kubernetes.io/name=kafka  tier=broker canary").unwrap();
        assert_eq!(s.terms().len(), 3);
        assert_eq!(
            s.to_query(),
            "app.kubernetes.io/name=kafka,canary,tier=broker"
        );
        assert!(s.matches(&labels(&[
            ("app.kubernetes.io/name", "kafka"),
            ("tier", "broker"),
            ("canary", "")
        ])));
        assert!(!s.matches(&labels(&[
            ("app.kubernetes.io/name", "kafka"),
            ("tier", "broker")
        ])));
        assert!(!s.matches(&labels(&[
            ("app.kubernetes.io/name", "kafka"),
            ("tier", "zk"),
            ("canary", "1")
        ])));
    }

    #[test]
    fn empty_value_is_allowed() {
        let s = Selector::parse("role=").unwrap();
        assert!(s.matches(&labels(&[("role", "")])));
        assert!(!s.matches(&labels(&[("role", "x")])));
    }

    #[test]
    fn refuses_empty_and_malformed_terms() {
        assert_eq!(Selector::parse("   "), Err(SelectorError::Empty));
        for bad in [
            "a!=b",
            "!a",
            "a==b",
            "=b",
            "a=b=c",
            "-a=b",
            "a=b-",
            "Bad_Prefix.io/x=1",
            "/x",
            "a/=1",
        ] {
            assert!(
                matches!(Selector::parse(bad), Err(SelectorError::BadTerm { .. })),
                "{bad} should be refused"
            );
        }
        let long = "k=".to_string() + &"v".repeat(64);
        assert!(Selector::parse(&long).is_err());
    }

    #[test]
    fn error_names_the_term() {
        let err = Selector::parse("app=web tier!=db").unwrap_err();
        assert!(err.to_string().contains("tier!=db"), "{err}");
    }

    #[test]
    fn common_terms_of_several_selectors() {
        let a = Selector::parse("app=web tier=fe team=x").unwrap();
        let b = Selector::parse("app=web tier=fe canary").unwrap();
        let c = Selector::parse("app=api").unwrap();
        assert_eq!(
            Selector::common([&a, &b].into_iter()).map(|s| s.to_query()),
            Some("app=web,tier=fe".to_string())
        );
        assert_eq!(Selector::common([&a, &b, &c].into_iter()), None);
        assert_eq!(Selector::common(std::iter::empty()), None);
        let common = Selector::common([&a, &b].into_iter()).unwrap();
        assert!(common.covers(&a) && common.covers(&b) && !common.covers(&c));
        assert!(!a.covers(&b), "team=x is not one of b's terms");
    }

    #[test]
    fn display_is_the_tag_form() {
        let s = Selector::parse("b=2 a").unwrap();
        assert_eq!(s.to_string(), "a b=2");
        assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
    }
}
