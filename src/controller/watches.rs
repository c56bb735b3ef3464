//! The watches: one reflector per bound namespace feeding the informer's stores, and
//! what each store event asks of the queue.

use super::*;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Run<'_, P, G, S> {
    /// Keeps one reflector per namespace to watch, started and stopped as the set
    /// changes.
    pub(super) async fn reflectors(&self) {
        let engine = self.engine;
        let sink = |event: StoreEvent<'_>| self.store_event(event);
        let mut wanted = self.namespaces.subscribe();
        let mut running: BTreeMap<String, (Option<Selector>, futures::future::AbortHandle)> =
            BTreeMap::new();
        let mut tasks = FuturesUnordered::new();
        let settings = ReflectorSettings {
            watch_request: engine.core.settings.watch_request,
            relist_after: engine.core.settings.relist_after,
        };
        loop {
            let target = wanted.borrow_and_update().clone();
            running.retain(|ns, (selector, handle)| {
                let keep = target.get(ns).is_some_and(|s| s == selector);
                if !keep {
                    handle.abort();
                }
                keep
            });
            for (ns, selector) in &target {
                if running.contains_key(ns) {
                    continue;
                }
                let (handle, registration) = futures::future::AbortHandle::new_pair();
                running.insert(ns.clone(), (selector.clone(), handle));
                let ns = ns.clone();
                let selector = selector.clone();
                let sink = &sink;
                tasks.push(futures::future::Abortable::new(
                    async move {
                        engine
                            .controller
                            .informer
                            .reflect(
                                &engine.core.pods,
                                engine.core.clock.as_ref(),
                                &ns,
                                selector,
                                settings,
                                sink,
                            )
                            .await;
                    },
                    registration,
                ));
            }
            tokio::select! {
                changed = wanted.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                Some(_) = tasks.next(), if !tasks.is_empty() => {}
            }
        }
    }

    /// What the informer saw: a pod change asks for a pass of every group whose target
    /// set it can change; a (re)list, of every group of the namespace.
    pub(super) fn store_event(&self, event: StoreEvent<'_>) {
        // Under `early`'s lock, so no change falls between it and the bound groups.
        let bound = {
            let mut early = lock(&self.early);
            if let Some(early) = early.as_mut() {
                match &event {
                    StoreEvent::Listed {
                        namespace,
                        again: true,
                        ..
                    } => early.anything(namespace, self.engine.core.clock.now()),
                    StoreEvent::Listed {
                        namespace,
                        again: false,
                        ..
                    } if early.first_list(namespace) => {
                        lock(&self.to_compare).push_back(FirstList {
                            namespace: (*namespace).to_owned(),
                            seen: self.engine.core.clock.now(),
                        });
                        self.compare_wake.notify_one();
                    }
                    StoreEvent::Pod {
                        namespace,
                        before,
                        after,
                        seen_at,
                    } => {
                        let named = early.pod(namespace, *before, *after, *seen_at);
                        if !named.is_empty() {
                            lock(&self.to_read).extend(named);
                            self.read_wake.notify_one();
                        }
                    }
                    _ => {}
                }
            }
            self.engine.core.index.snapshot()
        };
        let mut seen = self.engine.core.clock.now();
        let mut marked = Vec::new();
        {
            let mut out = lock(&self.out);
            match event {
                StoreEvent::Listed {
                    namespace,
                    pods,
                    again,
                } => {
                    out.watch.relisted += 1;
                    out.watch.listed_pods += pods as u64;
                    // A first LIST is the full diff's business; a LIST after a gap may
                    // hide any change.
                    if again {
                        marked.extend(
                            bound
                                .values()
                                .filter(|b| b.binding.namespace == namespace)
                                .map(|b| b.group.arn.clone()),
                        );
                    }
                }
                StoreEvent::Resumed => out.watch.resumed += 1,
                StoreEvent::Failed { namespace, error } => {
                    let text = format!("namespace `{namespace}`: {error}");
                    if !out.watch.errors.contains(&text) {
                        out.watch.errors.push(text);
                    }
                }
                StoreEvent::Pod {
                    namespace,
                    before,
                    after,
                    seen_at,
                } => {
                    seen = seen_at;
                    out.watch.events += 1;
                    marked.extend(
                        bound
                            .values()
                            .filter(|b| b.binding.namespace == namespace)
                            .filter(|b| early::changes(&b.binding, before, after))
                            .map(|b| b.group.arn.clone()),
                    );
                    out.watch.relevant_events += u64::from(!marked.is_empty());
                }
            }
        }
        self.ask_changes(marked.iter().map(|arn| (arn.as_str(), seen)));
    }
}
