//! Building UpdateItem requests: one `SET … REMOVE … ADD …` expression and a condition,
//! with exactly the attribute names and values they use (DynamoDB refuses unused ones).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::items::{self, NAMES};
use crate::core::lease_protocol::{Clause, Guard, Holder, Step};
use crate::state::Change;

/// An update expression under construction.
#[derive(Debug, Default)]
pub(super) struct Update {
    set: Vec<String>,
    remove: Vec<&'static str>,
    add: Vec<String>,
    condition: String,
    values: HashMap<String, AttributeValue>,
}

impl Update {
    /// `SET <clause>`.
    pub(super) fn set(mut self, clause: impl Into<String>) -> Self {
        self.set.push(clause.into());
        self
    }

    /// `REMOVE <name>`.
    pub(super) fn remove(mut self, name: &'static str) -> Self {
        self.remove.push(name);
        self
    }

    /// `ADD <clause>`.
    pub(super) fn add(mut self, clause: impl Into<String>) -> Self {
        self.add.push(clause.into());
        self
    }

    /// The condition expression.
    pub(super) fn condition(mut self, condition: impl Into<String>) -> Self {
        self.condition = condition.into();
        self
    }

    /// Adds a clause to the condition (with AND).
    pub(super) fn and_condition(mut self, condition: &str) -> Self {
        self.condition = if self.condition.is_empty() {
            condition.to_owned()
        } else {
            format!("({}) AND ({condition})", self.condition)
        };
        self
    }

    /// A value placeholder.
    pub(super) fn value(mut self, name: &str, value: AttributeValue) -> Self {
        self.values.insert(name.to_owned(), value);
        self
    }

    /// Adds what `change` writes: the ledger (and the record that `cluster`'s rows of
    /// the earlier layout are folded in, which the whole ledger now holds), backoff and
    /// checkpoint, and bumps `version` when anything changes.
    pub(super) fn change(mut self, change: &Change, cluster: &str) -> Self {
        if let Some(ledger) = &change.ledger {
            self = self
                .set("#l = :ledger")
                .value(":ledger", items::ledger_value(ledger))
                .add("#m :cluster")
                .value(":cluster", AttributeValue::Ss(vec![cluster.to_owned()]));
        }
        match &change.backoff {
            None => {}
            Some(Some(b)) => {
                self = self
                    .set("#b = :backoff")
                    .value(":backoff", items::backoff_value(b))
            }
            Some(None) => self = self.remove("#b"),
        }
        match &change.held {
            None => {}
            Some(h) if h.is_empty() => self = self.remove("#h"),
            Some(h) => self = self.set("#h = :held").value(":held", items::held_value(h)),
        }
        match &change.checkpoint {
            None => {}
            Some(Some(c)) => {
                self = self
                    .set("#c = :checkpoint")
                    .value(":checkpoint", items::checkpoint_value(c))
            }
            Some(None) => self = self.remove("#c"),
        }
        if let Some(seen) = &change.seen {
            self = self
                .set("#s = :seen")
                .value(":seen", items::seen_value(seen));
        }
        if !change.is_empty() {
            self = self
                .set("#v = if_not_exists(#v, :zero) + :one")
                .value(":zero", items::n(0))
                .value(":one", items::n(1));
        }
        self
    }

    /// An update that is one of the lease protocol's transitions.
    pub(super) fn step(step: &Step<String>) -> Self {
        Self::default().with_step(step)
    }

    /// Adds one of the lease protocol's transitions: its guard joins the condition (with
    /// AND), its effect the update (the version bumped once, also with a change). The
    /// in-memory fake applies the same step with `Step::apply`.
    pub(super) fn with_step(mut self, step: &Step<String>) -> Self {
        let guard = self.guard(&step.guard);
        self.condition = match (self.condition.is_empty(), guard) {
            (_, None) => self.condition,
            (true, Some(g)) => g,
            (false, Some(g)) => format!("({}) AND ({g})", self.condition),
        };
        let e = &step.effect;
        match &e.owner {
            Holder::Keep => {}
            Holder::Set(o) => {
                self = self
                    .set("#o = :e_owner")
                    .value(":e_owner", AttributeValue::S(o.clone()))
            }
            Holder::Remove => self = self.remove("#o").remove("#u"),
        }
        if let Some(u) = e.until {
            self = self.set("#u = :e_until").value(":e_until", items::n(u));
        }
        if let Some(d) = e.dirty {
            self = self
                .set("#d = :e_dirty")
                .value(":e_dirty", AttributeValue::Bool(d));
        }
        if e.take {
            // Taking the lease removes the verification checkpoint.
            self = self.remove("#c");
        }
        if e.bump && !self.set.iter().any(|c| c.starts_with("#v =")) {
            self = self
                .set("#v = if_not_exists(#v, :zero) + :one")
                .value(":zero", items::n(0))
                .value(":one", items::n(1));
        }
        self
    }

    /// A guard as a condition expression, its values added (`None`: always holds).
    fn guard(&mut self, guard: &Guard<String>) -> Option<String> {
        if guard.0.is_empty() {
            return None;
        }
        let mut any = Vec::new();
        for all in &guard.0 {
            let mut parts = Vec::new();
            for clause in all {
                parts.push(self.clause(clause));
            }
            any.push(format!("({})", parts.join(" AND ")));
        }
        Some(any.join(" OR "))
    }

    /// One clause, its value under a fresh placeholder.
    fn clause(&mut self, clause: &Clause<String>) -> String {
        let name = format!(
            ":g{}",
            self.values.keys().filter(|k| k.starts_with(":g")).count()
        );
        let (text, value) = match clause {
            Clause::NoOwner => return "attribute_not_exists(#o)".to_owned(),
            Clause::VersionIs(0) => return "attribute_not_exists(#v)".to_owned(),
            Clause::OwnerIs(o) => ("#o = {}", AttributeValue::S(o.clone())),
            Clause::UntilAtLeast(t) => ("#u >= {}", items::n(*t)),
            Clause::UntilBefore(t) => ("#u < {}", items::n(*t)),
            Clause::NotDirty => (
                "(attribute_not_exists(#d) OR #d = {})",
                AttributeValue::Bool(false),
            ),
            Clause::VersionIs(v) => ("#v = {}", items::n(*v)),
        };
        self.values.insert(name.clone(), value);
        text.replace("{}", &name)
    }

    /// The update expression.
    pub(super) fn expression(&self) -> String {
        let mut parts = Vec::new();
        if !self.set.is_empty() {
            parts.push(format!("SET {}", self.set.join(", ")));
        }
        if !self.remove.is_empty() {
            parts.push(format!("REMOVE {}", self.remove.join(", ")));
        }
        if !self.add.is_empty() {
            parts.push(format!("ADD {}", self.add.join(", ")));
        }
        parts.join(" ")
    }

    /// The condition expression (empty: none).
    pub(super) fn condition_expression(&self) -> Option<String> {
        (!self.condition.is_empty()).then(|| self.condition.clone())
    }

    /// The attribute names the expressions use.
    pub(super) fn names(&self) -> HashMap<String, String> {
        let text = format!("{} {}", self.expression(), self.condition);
        NAMES
            .iter()
            .filter(|(placeholder, _)| mentions(&text, placeholder))
            .map(|(p, n)| ((*p).to_owned(), (*n).to_owned()))
            .collect()
    }

    /// The values the expressions use.
    pub(super) fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        let text = format!("{} {}", self.expression(), self.condition);
        let used: HashMap<String, AttributeValue> = self
            .values
            .iter()
            .filter(|(k, _)| mentions(&text, k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!used.is_empty()).then_some(used)
    }
}

/// Whether `text` uses `token` as a whole placeholder (`:one` is not in `:once`).
fn mentions(text: &str, token: &str) -> bool {
    text.match_indices(token).any(|(i, _)| {
        text[i + token.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{BackoffState, UnixMillis};

    #[test]
    fn a_protocol_step_is_its_condition_and_update() {
        use crate::core::lease_protocol as protocol;
        let me = "a".to_owned();
        let u = Update::step(&protocol::renew(&me, 20));
        assert_eq!(u.condition, "(#o = :g0 AND #u < :g1)");
        assert_eq!(u.expression(), "SET #u = :e_until");
        let u = Update::step(&protocol::take(&me, 5, 20));
        assert_eq!(
            u.condition,
            "(attribute_not_exists(#o)) OR (#u < :g0) OR (#o = :g1)"
        );
        assert_eq!(
            u.expression(),
            "SET #o = :e_owner, #u = :e_until, #d = :e_dirty, #v = if_not_exists(#v, :zero) + :one REMOVE #c"
        );
        let with_change = Update::default()
            .change(
                &Change {
                    seen: Some(Default::default()),
                    ..Change::default()
                },
                "c",
            )
            .with_step(&protocol::release(&me, 3, 7, true, true));
        assert_eq!(
            with_change.condition,
            "(#o = :g0 AND #u >= :g1 AND #v = :g2 AND (attribute_not_exists(#d) OR #d = :g3))"
        );
        assert_eq!(
            with_change.expression().matches("#v =").count(),
            1,
            "the version bumped once"
        );
    }

    #[test]
    fn a_change_writes_exactly_its_parts() {
        let change = Change {
            ledger: Some(Default::default()),
            backoff: Some(None),
            held: None,
            checkpoint: None,
            seen: None,
        };
        let u = Update::default()
            .change(&change, "blue")
            .condition("#o = :me")
            .value(":me", items::n(1))
            .value(":unused", items::n(2));
        assert_eq!(
            u.expression(),
            "SET #l = :ledger, #v = if_not_exists(#v, :zero) + :one REMOVE #b ADD #m :cluster"
        );
        let names = u.names();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(!names.contains_key("#c") && !names.contains_key("#u"));
        let values = u.values().unwrap();
        assert!(values.contains_key(":me") && !values.contains_key(":unused"));
        let only_backoff = Update::default().change(
            &Change {
                backoff: Some(Some(BackoffState {
                    failures: 1,
                    next_attempt: UnixMillis(5),
                })),
                ..Change::default()
            },
            "blue",
        );
        assert!(
            !only_backoff.expression().contains("#m"),
            "no ledger, no migration mark"
        );
        assert!(
            Update::default()
                .change(&Change::default(), "b")
                .expression()
                .is_empty()
        );
    }
}
