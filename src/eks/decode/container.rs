//! What the lean pod decoder reads of a container (`spec.containers`,
//! `spec.initContainers`): its named ports, and its `preStop` hook as the rollout check
//! reads it (`crate::core::termination`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{Str, skip};
use crate::core::pod::SIDECAR_RESTART_POLICY;
use crate::core::termination::PreStop;

/// `spec.containers` or `spec.initContainers` (`null` is empty): appends the named
/// ports to `ports`; of init containers, only those of native sidecars. The app
/// containers' `preStop` hooks are combined into `pre_stop` (the longest readable
/// sleep; init containers' are not read).
pub(super) struct ContainersSeed<'p> {
    pub(super) ports: &'p mut Vec<(String, u16)>,
    pub(super) sidecars: bool,
    pub(super) pre_stop: &'p mut PreStop,
}

impl<'de> Visitor<'de> for ContainersSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of containers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let sidecars = self.sidecars;
        while let Some(hook) = seq.next_element_seed(ContainerSeed {
            ports: &mut *self.ports,
            sidecars,
        })? {
            if !sidecars {
                *self.pre_stop = self.pre_stop.longest(hook);
            }
        }
        Ok(())
    }
}

/// One container: its named ports, dropped again for a plain init container, and its
/// `preStop` hook (returned).
struct ContainerSeed<'p> {
    ports: &'p mut Vec<(String, u16)>,
    sidecars: bool,
}

fields!(ContainerField {
    "ports" => Ports,
    "restartPolicy" => RestartPolicy,
    "lifecycle" => Lifecycle,
});

impl<'de> DeserializeSeed<'de> for ContainerSeed<'_> {
    type Value = PreStop;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PreStop, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ContainerSeed<'_> {
    type Value = PreStop;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Container")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PreStop, A::Error> {
        let start = self.ports.len();
        let mut sidecar = false;
        let mut pre_stop = PreStop::None;
        while let Some(key) = map.next_key::<ContainerField>()? {
            match key {
                ContainerField::Ports => {
                    // A repeated `ports` replaces the earlier one.
                    self.ports.truncate(start);
                    map.next_value_seed(NullIsEmpty(PortsSeed {
                        ports: &mut *self.ports,
                    }))?;
                }
                ContainerField::RestartPolicy => {
                    let policy: Option<Str<'de>> = map.next_value()?;
                    sidecar = policy.is_some_and(|p| p.0 == SIDECAR_RESTART_POLICY);
                }
                ContainerField::Lifecycle => {
                    let lifecycle: Option<Lifecycle> = map.next_value()?;
                    pre_stop = lifecycle.map_or(PreStop::None, |l| l.0);
                }
                ContainerField::Other => skip(&mut map)?,
            }
        }
        if self.sidecars && !sidecar {
            self.ports.truncate(start);
        }
        Ok(pre_stop)
    }
}

/// A container's `lifecycle`: its `preStop` hook as the rollout check reads it.
struct Lifecycle(PreStop);

fields!(LifecycleField {
    "preStop" => PreStop,
});

deserialize_from!(map, Lifecycle, "Lifecycle", |map| {
    let mut pre_stop = PreStop::None;
    while let Some(key) = map.next_key::<LifecycleField>()? {
        match key {
            LifecycleField::PreStop => {
                let hook: Option<Hook> = map.next_value()?;
                pre_stop = hook.map_or(PreStop::None, |h| h.0);
            }
            LifecycleField::Other => skip(&mut map)?,
        }
    }
    Ok(Lifecycle(pre_stop))
});

/// A `LifecycleHandler`: its native sleep, else its `exec` command, else unknown (an
/// `httpGet`, a `tcpSocket`).
struct Hook(PreStop);

fields!(HookField {
    "sleep" => Sleep,
    "exec" => Exec,
});

deserialize_from!(map, Hook, "LifecycleHandler", |map| {
    let mut sleep: Option<SleepAction> = None;
    let mut exec: Option<ExecAction> = None;
    while let Some(key) = map.next_key::<HookField>()? {
        match key {
            HookField::Sleep => sleep = map.next_value()?,
            HookField::Exec => exec = map.next_value()?,
            HookField::Other => skip(&mut map)?,
        }
    }
    Ok(Hook(match (sleep, exec) {
        (Some(s), _) => PreStop::native_sleep(s.0),
        (None, Some(ExecAction(Some(command)))) => PreStop::exec(&command),
        (None, _) => PreStop::Unknown,
    }))
});

/// A `SleepAction`: its `seconds` (0 when absent, as k8s-openapi reads a missing
/// required field).
struct SleepAction(i64);

fields!(SleepField {
    "seconds" => Seconds,
});

deserialize_from!(map, SleepAction, "SleepAction", |map| {
    let mut seconds: Option<i64> = None;
    while let Some(key) = map.next_key::<SleepField>()? {
        match key {
            SleepField::Seconds => seconds = map.next_value()?,
            SleepField::Other => skip(&mut map)?,
        }
    }
    Ok(SleepAction(seconds.unwrap_or_default()))
});

/// An `ExecAction`: its `command`.
struct ExecAction(Option<Vec<String>>);

fields!(ExecField {
    "command" => Command,
});

deserialize_from!(map, ExecAction, "ExecAction", |map| {
    let mut command = None;
    while let Some(key) = map.next_key::<ExecField>()? {
        match key {
            ExecField::Command => command = map.next_value()?,
            ExecField::Other => skip(&mut map)?,
        }
    }
    Ok(ExecAction(command))
});

/// A container's `ports` (`null` is empty): appends `(name, number)` of every named
/// port whose number fits a `u16`.
struct PortsSeed<'p> {
    ports: &'p mut Vec<(String, u16)>,
}

impl<'de> Visitor<'de> for PortsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of container ports")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(port) = seq.next_element::<Port>()? {
            if let (Some(name), Ok(number)) = (port.name, u16::try_from(port.number)) {
                self.ports.push((name, number));
            }
        }
        Ok(())
    }
}

/// One `ContainerPort`.
struct Port {
    name: Option<String>,
    /// `containerPort`, 0 when absent (k8s-openapi's default for a required field).
    number: i32,
}

fields!(PortField {
    "name" => Name,
    "containerPort" => ContainerPort,
});

deserialize_from!(map, Port, "ContainerPort", |map| {
    let mut name = None;
    let mut number: Option<i32> = None;
    while let Some(key) = map.next_key::<PortField>()? {
        match key {
            PortField::Name => name = map.next_value()?,
            PortField::ContainerPort => number = map.next_value()?,
            PortField::Other => skip(&mut map)?,
        }
    }
    Ok(Port {
        name,
        number: number.unwrap_or_default(),
    })
});

/// A sequence read by the visitor it wraps, where `null` is empty.
pub(super) struct NullIsEmpty<V>(pub(super) V);

impl<'de, V: Visitor<'de, Value = ()>> DeserializeSeed<'de> for NullIsEmpty<V> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, V: Visitor<'de, Value = ()>> Visitor<'de> for NullIsEmpty<V> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self.0)
    }
}
