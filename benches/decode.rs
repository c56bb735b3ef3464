//! Benchmark (not a test): decoding 100,000 realistic pods, as LIST pages of 500 arrive,
//! into `PodFacts` two ways:
//!
//! - (a) what `Api::<Pod>::list` did: the body as text into kube's `ObjectList<Pod>`
//!   (full k8s-openapi pods), `PodFacts::take_from` on each, then the pods dropped;
//! - (b) `tgsync::eks::decode_pod_list`, the lean decoder `KubePods` uses now.
//!
//! For reference it also times k8s-openapi's own `List<Pod>` (full pods, without the
//! page-wide buffering of kube's flattened `ObjectList`), the UTF-8 check alone, and
//! serde_json reading every byte while keeping nothing (`IgnoredAny`): the floor for
//! any decoder built on serde_json.
//!
//! Run: `cargo bench --bench decode` (add `-- --quick` for fewer rounds). Pods come from
//! `PodBuilder::realistic()` (managedFields, three containers with env, probes and
//! mounts, volumes, container statuses), serialized once up front; only decoding is
//! timed. Each figure is the median of the rounds, in ms per 100,000 pods. One more
//! pass of each, with the counting allocator on, gives the peak heap above the page
//! bodies while the facts of every page are kept.

#[path = "support/heap.rs"]
mod heap;
#[path = "support/measure.rs"]
mod measure;

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::core::ObjectList;
use tgsync::core::PodFacts;
use tgsync::eks::decode_pod_list;
use tgsync::testkit::PodBuilder;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

const PODS: usize = 100_000;
const PAGE: usize = 500;
const GROUPS: usize = 1_000;
const MIB: f64 = 1024.0 * 1024.0;

/// The LIST page bodies, and the total JSON size of the pods in them.
fn pages() -> (Vec<Vec<u8>>, usize) {
    let mut bodies = Vec::with_capacity(PODS / PAGE);
    let mut pod_bytes = 0;
    for (n, chunk) in (0..PODS).collect::<Vec<_>>().chunks(PAGE).enumerate() {
        let mut body = Vec::with_capacity(PAGE * 4096);
        let last = (n + 1) * PAGE >= PODS;
        let continue_token = if last {
            String::new()
        } else {
            format!(
                r#","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDgyMTMsInN0YXJ0Ijoic3ZjLXtufSJ9{n}""#
            )
        };
        let remaining = PODS.saturating_sub((n + 1) * PAGE);
        write!(
            body,
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"48213"{continue_token},"remainingItemCount":{remaining}}},"items":["#
        )
        .unwrap();
        for (k, &i) in chunk.iter().enumerate() {
            if k > 0 {
                body.push(b',');
            }
            let before = body.len();
            serde_json::to_writer(&mut body, &pod(i)).unwrap();
            pod_bytes += body.len() - before;
        }
        body.extend_from_slice(b"]}");
        bodies.push(body);
    }
    (bodies, pod_bytes)
}

/// Pod `i`: one of 100 replicas of `svc-N`, 5 % not ready.
fn pod(i: usize) -> Pod {
    let group = i % GROUPS;
    PodBuilder::new(&format!("ns-{}", group % 10), &format!("svc-{group}-{i}"))
        .label("app", &format!("svc-{group}"))
        .label("tier", "backend")
        .ip(&Ipv4Addr::from(0x0a00_0000u32 + i as u32).to_string())
        .ready(!i.is_multiple_of(20))
        .realistic()
        .build()
}

/// (a): kube's `ObjectList<Pod>` from the body text, `take_from`, drop. Returns the
/// total time and the part spent in serde_json.
fn via_k8s_openapi(bodies: &[Vec<u8>], facts: &mut Vec<PodFacts>) -> (Duration, Duration) {
    let (mut total, mut deserialize) = (Duration::ZERO, Duration::ZERO);
    for body in bodies {
        let t = Instant::now();
        let text = std::str::from_utf8(body).expect("bench pages are UTF-8");
        let mut page: ObjectList<Pod> = serde_json::from_str(text).expect("bench pages decode");
        let parsed = t.elapsed();
        facts.extend(page.items.iter_mut().map(PodFacts::take_from));
        drop(page);
        total += t.elapsed();
        deserialize += parsed;
    }
    (total, deserialize)
}

/// k8s-openapi's `List<Pod>`, `take_from`, drop: full pods without kube's flattening.
fn via_k8s_list(bodies: &[Vec<u8>], facts: &mut Vec<PodFacts>) -> Duration {
    let t = Instant::now();
    for body in bodies {
        let text = std::str::from_utf8(body).expect("bench pages are UTF-8");
        let mut page: k8s_openapi::List<Pod> =
            serde_json::from_str(text).expect("bench pages decode");
        facts.extend(page.items.iter_mut().map(PodFacts::take_from));
    }
    t.elapsed()
}

/// (b): the lean decoder.
fn via_lean(bodies: &[Vec<u8>], facts: &mut Vec<PodFacts>) -> Duration {
    let mut total = Duration::ZERO;
    for (n, body) in bodies.iter().enumerate() {
        let t = Instant::now();
        let page = decode_pod_list(n + 1, body).expect("bench pages decode");
        facts.extend(page.pods);
        total += t.elapsed();
    }
    total
}

/// Reference floors: the UTF-8 check alone, and serde_json reading every page while
/// keeping nothing (`IgnoredAny`), which no decoder built on serde_json can beat.
fn floors(bodies: &[Vec<u8>]) -> (Duration, Duration) {
    let t = Instant::now();
    for body in bodies {
        std::hint::black_box(std::str::from_utf8(body).is_ok());
    }
    let utf8 = t.elapsed();
    let t = Instant::now();
    for body in bodies {
        let text = std::str::from_utf8(body).expect("bench pages are UTF-8");
        serde_json::from_str::<serde::de::IgnoredAny>(text).expect("bench pages are JSON");
    }
    (utf8, t.elapsed())
}

/// Peak heap above the current one during `pass`, in MiB.
fn peak_of(pass: impl FnOnce()) -> f64 {
    heap::zero();
    heap::set_counting(true);
    let base = heap::restart_peak();
    pass();
    let peak = heap::peak() - base;
    heap::set_counting(false);
    peak as f64 / MIB
}

fn median(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0])
}

fn main() {
    heap::set_counting(false);
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 7 };
    let t = Instant::now();
    let (bodies, pod_bytes) = pages();
    let total: usize = bodies.iter().map(Vec::len).sum();
    println!(
        "decode bench: {PODS} realistic pods, average {} bytes of JSON per pod; {} pages of {PAGE} \
         ({:.1} MiB, {:.2} MiB per page), built in {:.1} s; {rounds} rounds",
        pod_bytes / PODS,
        bodies.len(),
        total as f64 / MIB,
        total as f64 / bodies.len() as f64 / MIB,
        t.elapsed().as_secs_f64()
    );

    // Both paths give the same facts.
    let (mut a, mut b) = (Vec::with_capacity(PODS), Vec::with_capacity(PODS));
    via_k8s_openapi(&bodies, &mut a);
    via_lean(&bodies, &mut b);
    assert_eq!(a.len(), PODS);
    assert!(a == b, "the two decoders disagree");
    drop((a, b));

    let (mut heavy, mut heavy_parse, mut lean) = (Vec::new(), Vec::new(), Vec::new());
    let (mut utf8, mut skim, mut list) = (Vec::new(), Vec::new(), Vec::new());
    let mut facts = Vec::with_capacity(PODS);
    for _ in 0..rounds {
        let (total, parse) = via_k8s_openapi(&bodies, &mut facts);
        heavy.push(total);
        heavy_parse.push(parse);
        facts.clear();
        lean.push(via_lean(&bodies, &mut facts));
        facts.clear();
        list.push(via_k8s_list(&bodies, &mut facts));
        facts.clear();
        let (u, s) = floors(&bodies);
        utf8.push(u);
        skim.push(s);
    }
    let ms = measure::ms;
    let scale = PODS as f64 / 100_000.0;
    let (a_med, a_best) = median(heavy);
    let (p_med, _) = median(heavy_parse);
    let (b_med, b_best) = median(lean);
    println!(
        "(a) k8s-openapi: ObjectList<Pod> + take_from + drop: median {:.0} ms per 100,000 pods \
         (best {:.0}; serde_json into Pods {:.0} ms of it, take_from + drop the rest)",
        ms(a_med) / scale,
        ms(a_best) / scale,
        ms(p_med) / scale
    );
    println!(
        "(b) lean decode_pod_list: median {:.0} ms per 100,000 pods (best {:.0}); {:.1}x faster",
        ms(b_med) / scale,
        ms(b_best) / scale,
        a_med.as_secs_f64() / b_med.as_secs_f64()
    );
    println!(
        "    throughput: (a) {:.0} MiB/s, (b) {:.0} MiB/s of JSON",
        total as f64 / MIB / a_med.as_secs_f64(),
        total as f64 / MIB / b_med.as_secs_f64()
    );
    let (list, _) = median(list);
    let (utf8, _) = median(utf8);
    let (skim, _) = median(skim);
    println!(
        "    reference: k8s-openapi List<Pod> + take_from + drop {:.0} ms per 100,000 pods",
        ms(list) / scale
    );
    println!(
        "    floors: UTF-8 check alone {:.0} ms; serde_json reading everything, keeping nothing \
         (IgnoredAny, UTF-8 check included) {:.0} ms per 100,000 pods",
        ms(utf8) / scale,
        ms(skim) / scale
    );

    // Peak heap of a whole pass, page bodies not counted (they were allocated before).
    facts.shrink_to_fit();
    let mut kept = Vec::new();
    let a_peak = peak_of(|| {
        via_k8s_openapi(&bodies, &mut kept);
    });
    drop(std::mem::take(&mut kept));
    let b_peak = peak_of(|| {
        via_lean(&bodies, &mut kept);
    });
    println!(
        "peak heap of a pass (facts of every page kept, page bodies excluded): (a) {a_peak:.1} MiB, (b) {b_peak:.1} MiB"
    );
}
