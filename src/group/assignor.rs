//! Server-side partition assignors of the next-generation consumer group protocol
//! (KIP-848, section "Assignors"): `uniform` and `range`, after Kafka's `UniformAssignor`
//! (`UniformHomogeneousAssignmentBuilder` / `UniformHeterogeneousAssignmentBuilder`) and
//! `RangeAssignor` in the `group-coordinator` module.
//!
//! Pure functions over plain maps: [`assign`] turns the members' subscriptions, the topics'
//! partition counts and the previous target assignment into a new target assignment.
//! Deterministic: ties are broken by member id order, then topic name order. A partition
//! count above [`MAX_PARTITIONS_PER_TOPIC`] is treated as that many partitions.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// The largest partition count an assignor honours per topic; a topic reporting more (up to
/// `i32::MAX`) is treated as having exactly this many partitions, so that a corrupt or
/// absurd count cannot make the assignor allocate gigabytes.
pub(crate) const MAX_PARTITIONS_PER_TOPIC: i32 = 1_000_000;

/// A server-side assignor (ConsumerGroupHeartbeat `server_assignor`, broker key
/// `group.consumer.assignors`; KIP-848 "Assignors").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignorKind {
    /// Kafka's `UniformAssignor` ("uniform"): balanced partition counts, sticky.
    Uniform,
    /// Kafka's `RangeAssignor` ("range"): contiguous per-topic ranges by member id.
    Range,
}

impl AssignorKind {
    /// "uniform" / "range" (case-sensitive as Kafka), None otherwise.
    pub fn from_name(name: &str) -> Option<AssignorKind> {
        match name {
            "uniform" => Some(AssignorKind::Uniform),
            "range" => Some(AssignorKind::Range),
            _ => None,
        }
    }

    /// The assignor's wire name: "uniform" or "range".
    pub fn name(self) -> &'static str {
        match self {
            AssignorKind::Uniform => "uniform",
            AssignorKind::Range => "range",
        }
    }
}

/// A target assignment: member id → topic name → partitions (indices `0..count`).
pub(crate) type TargetAssignment = BTreeMap<String, BTreeMap<String, BTreeSet<i32>>>;

/// The input of an assignor (Kafka's `GroupSpec` + `SubscribedTopicDescriber`).
pub(crate) struct AssignmentSpec<'a> {
    /// member id → the names of the existing topics it subscribes to.
    pub members: &'a BTreeMap<String, BTreeSet<String>>,
    /// topic name → partition count (every topic any member subscribes to; may hold others).
    pub topics: &'a BTreeMap<String, i32>,
    /// The previous target assignment (may name members or topics that are gone, or
    /// partitions beyond a count).
    pub previous: &'a TargetAssignment,
}

/// Computes the new target assignment: one entry per member of `spec.members` (empty when
/// it gets nothing); every partition of every subscribed, existing topic goes to exactly
/// one member subscribed to it. Cost: `uniform` is O(P + M log M) with identical
/// subscriptions and about O(P·T·log M) otherwise (P partitions, M members, T topics per
/// member); `range` is O(P + M·T).
pub(crate) fn assign(kind: AssignorKind, spec: &AssignmentSpec<'_>) -> TargetAssignment {
    let problem = Problem::new(spec);
    let owner = match kind {
        AssignorKind::Range => range(&problem),
        AssignorKind::Uniform => {
            let (owner, kept) = retain(&problem, spec.previous);
            let homogeneous = problem.subs.windows(2).all(|w| w[0] == w[1]);
            if homogeneous {
                uniform_homogeneous(&problem, owner, kept)
            } else {
                uniform_heterogeneous(&problem, owner, kept)
            }
        }
    };
    let members = problem.ids.len();
    let mut out: Vec<BTreeMap<String, BTreeSet<i32>>> = vec![BTreeMap::new(); members];
    let mut parts: Vec<Vec<i32>> = vec![Vec::new(); members];
    for (t, owners) in owner.iter().enumerate() {
        for (part, &m) in owners.iter().enumerate() {
            if let Some(buf) = parts.get_mut(m as usize) {
                buf.push(part as i32);
            }
        }
        for (map, buf) in out.iter_mut().zip(&mut parts) {
            if !buf.is_empty() {
                // Sorted input: `BTreeSet` builds it in bulk.
                map.insert(problem.names[t].to_owned(), buf.drain(..).collect());
            }
        }
    }
    problem
        .ids
        .iter()
        .map(|id| id.to_string())
        .zip(out)
        .collect()
}

/// Marks a partition without owner in the per-topic owner arrays.
const NO_OWNER: u32 = u32::MAX;

/// Per topic index, per partition: the owning member index, or [`NO_OWNER`].
type Owners = Vec<Vec<u32>>;

/// Per member index: the (topic index, partition) pairs kept from the previous assignment.
type Kept = Vec<Vec<(usize, i32)>>;

/// The input, indexed: members in id order, subscribed topics in name order.
struct Problem<'a> {
    ids: Vec<&'a str>,
    names: Vec<&'a str>,
    /// Partition count per topic index (capped, > 0).
    counts: Vec<usize>,
    /// Sorted topic indices each member subscribes to (only existing topics with count > 0).
    subs: Vec<Vec<usize>>,
}

impl<'a> Problem<'a> {
    fn new(spec: &AssignmentSpec<'a>) -> Problem<'a> {
        let valid = |n: &&String| spec.topics.get(*n).is_some_and(|&c| c > 0);
        let names: BTreeSet<&'a str> = spec
            .members
            .values()
            .flatten()
            .filter(valid)
            .map(String::as_str)
            .collect();
        let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let subs = spec.members.values();
        Problem {
            ids: spec.members.keys().map(String::as_str).collect(),
            // Every name passed `valid`, so indexing `spec.topics` cannot fail.
            counts: names
                .iter()
                .map(|&n| spec.topics[n].min(MAX_PARTITIONS_PER_TOPIC) as usize)
                .collect(),
            names: names.into_iter().collect(),
            subs: subs
                .map(|ts| {
                    ts.iter()
                        .filter_map(|n| index.get(n.as_str()).copied())
                        .collect()
                })
                .collect(),
        }
    }
}

/// Range: per topic, its subscribers in id order get contiguous ranges, the first `P % M`
/// of them `P / M + 1` partitions and the rest `P / M`.
fn range(p: &Problem) -> Owners {
    let mut subscribers = vec![Vec::new(); p.names.len()];
    for (m, subs) in p.subs.iter().enumerate() {
        for &t in subs {
            subscribers[t].push(m as u32);
        }
    }
    let mut owner: Owners = Vec::with_capacity(p.names.len());
    for (t, members) in subscribers.iter().enumerate() {
        let (count, n) = (p.counts[t], members.len());
        let mut owners = Vec::with_capacity(count);
        for (k, &m) in members.iter().enumerate() {
            let len = count / n + usize::from(k < count % n);
            owners.extend(std::iter::repeat_n(m, len));
        }
        owner.push(owners);
    }
    owner
}

/// Keeps each previous owner's partitions that still exist and that it still subscribes to
/// (a partition claimed twice goes to the first member in id order). Returns the owner
/// arrays and, per member, its kept (topic, partition) pairs in ascending order.
fn retain(p: &Problem, previous: &TargetAssignment) -> (Owners, Kept) {
    let mut owner: Owners = p.counts.iter().map(|&c| vec![NO_OWNER; c]).collect();
    let mut kept = vec![Vec::new(); p.ids.len()];
    for (m, id) in p.ids.iter().enumerate() {
        let Some(prev) = previous.get(*id) else {
            continue;
        };
        for &t in &p.subs[m] {
            let Some(parts) = prev.get(p.names[t]) else {
                continue;
            };
            for &part in parts.range(0..p.counts[t] as i32) {
                let slot = &mut owner[t][part as usize];
                if *slot == NO_OWNER {
                    *slot = m as u32;
                    kept[m].push((t, part));
                }
            }
        }
    }
    (owner, kept)
}

/// Uniform, identical subscriptions: quotas `floor(P/M)`, with the `P % M` ceil slots going
/// to the members that kept the most (then by id); each member drops its highest partitions
/// above quota; free partitions fill members below quota in id order.
fn uniform_homogeneous(p: &Problem, mut owner: Owners, kept: Kept) -> Owners {
    let members = p.ids.len();
    let Some(topics) = p.subs.first() else {
        return owner;
    };
    let total: usize = topics.iter().map(|&t| p.counts[t]).sum();
    let mut order: Vec<usize> = (0..members).collect();
    order.sort_by_key(|&m| (Reverse(kept[m].len()), m));
    let mut quota = vec![total / members; members];
    for &m in &order[..total % members] {
        quota[m] += 1;
    }
    let mut held = vec![0; members];
    for (m, parts) in kept.iter().enumerate() {
        for &(t, part) in parts.iter().skip(quota[m]) {
            owner[t][part as usize] = NO_OWNER;
        }
        held[m] = parts.len().min(quota[m]);
    }
    // Free slots equal the sum of (quota - held), so `next` never runs past the end.
    let mut next = 0;
    for &t in topics {
        for slot in owner[t].iter_mut().filter(|s| **s == NO_OWNER) {
            while held[next] >= quota[next] {
                next += 1;
            }
            *slot = next as u32;
            held[next] += 1;
        }
    }
    owner
}

/// Mutable state of the heterogeneous uniform assignor.
struct Hetero<'p> {
    subs: &'p [Vec<usize>],
    owner: Owners,
    /// Partitions held per member.
    held: Vec<usize>,
    /// Per member: topic → partitions held.
    owned: Vec<BTreeMap<usize, BTreeSet<i32>>>,
    /// Per topic: (held, member) of every subscriber.
    eligible: Vec<BTreeSet<(usize, usize)>>,
    /// Per topic: (held, member) of every member holding at least one of its partitions.
    owners: Vec<BTreeSet<(usize, usize)>>,
}

impl Hetero<'_> {
    /// Re-keys member `m` in every per-topic set after its count changed from `old`.
    fn rekey(&mut self, m: usize, old: usize) {
        let new = self.held[m];
        for &t in &self.subs[m] {
            self.eligible[t].remove(&(old, m));
            self.eligible[t].insert((new, m));
            if self.owners[t].remove(&(old, m)) {
                self.owners[t].insert((new, m));
            }
        }
    }

    /// Gives partition `part` of topic `t` to member `m`.
    fn give(&mut self, m: usize, t: usize, part: i32) {
        self.held[m] += 1;
        self.rekey(m, self.held[m] - 1);
        let set = self.owned[m].entry(t).or_default();
        if set.is_empty() {
            self.owners[t].insert((self.held[m], m));
        }
        set.insert(part);
        self.owner[t][part as usize] = m as u32;
    }

    /// Takes `m`'s highest partition of topic `t`; None when it holds none.
    fn take(&mut self, m: usize, t: usize) -> Option<i32> {
        let set = self.owned[m].get_mut(&t)?;
        let part = set.pop_last()?;
        if set.is_empty() {
            self.owned[m].remove(&t);
            self.owners[t].remove(&(self.held[m], m));
        }
        self.held[m] -= 1;
        self.rekey(m, self.held[m] + 1);
        Some(part)
    }
}

/// Uniform, differing subscriptions: keep what is still valid, give each free partition
/// (topics with fewest subscribers first) to the subscriber holding fewest, then move
/// partitions from a topic's fullest holder to its emptiest subscriber while they differ by
/// 2 or more. Each move lowers the sum of squared counts, so the loop ends.
fn uniform_heterogeneous(p: &Problem, owner: Owners, kept: Kept) -> Owners {
    let topics = p.names.len();
    let mut s = Hetero {
        subs: &p.subs,
        owner,
        held: kept.iter().map(Vec::len).collect(),
        owned: vec![BTreeMap::new(); p.ids.len()],
        eligible: vec![BTreeSet::new(); topics],
        owners: vec![BTreeSet::new(); topics],
    };
    for (m, parts) in kept.into_iter().enumerate() {
        for (t, part) in parts {
            s.owned[m].entry(t).or_default().insert(part);
        }
        for &t in &p.subs[m] {
            s.eligible[t].insert((s.held[m], m));
        }
        for &t in s.owned[m].keys() {
            s.owners[t].insert((s.held[m], m));
        }
    }
    let mut order: Vec<usize> = (0..topics).collect();
    order.sort_by_key(|&t| (s.eligible[t].len(), t));
    for t in order {
        for part in 0..p.counts[t] {
            if s.owner[t][part] != NO_OWNER {
                continue;
            }
            let Some(&(_, m)) = s.eligible[t].first() else {
                break;
            };
            s.give(m, t, part as i32);
        }
    }
    loop {
        let mut moved = false;
        for t in 0..topics {
            while let (Some(&(low, to)), Some(&(high, from))) =
                (s.eligible[t].first(), s.owners[t].last())
            {
                if high < low + 2 {
                    break;
                }
                let Some(part) = s.take(from, t) else { break };
                s.give(to, t, part);
                moved = true;
            }
        }
        if !moved {
            return s.owner;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        /// xorshift64, reduced to `0..n`.
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    type Members = BTreeMap<String, BTreeSet<String>>;
    type Topics = BTreeMap<String, i32>;

    fn run(kind: AssignorKind, m: &Members, t: &Topics, p: &TargetAssignment) -> TargetAssignment {
        let spec = AssignmentSpec {
            members: m,
            topics: t,
            previous: p,
        };
        let out = assign(kind, &spec);
        check_valid(m, t, &out);
        assert_eq!(out, assign(kind, &spec), "deterministic");
        out
    }

    fn held(out: &TargetAssignment, m: &str) -> usize {
        out[m].values().map(BTreeSet::len).sum()
    }

    /// topic → partition → owner.
    fn owners(out: &TargetAssignment) -> BTreeMap<(String, i32), String> {
        let mut o = BTreeMap::new();
        for (m, topics) in out {
            for (t, parts) in topics {
                for &p in parts {
                    assert!(o.insert((t.clone(), p), m.clone()).is_none(), "{t}-{p}");
                }
            }
        }
        o
    }

    /// Requirements 1 and 2.
    fn check_valid(m: &Members, t: &Topics, out: &TargetAssignment) {
        assert!(out.keys().eq(m.keys()), "one entry per member");
        let o = owners(out);
        let mut expected = 0;
        for (name, &count) in t {
            if m.values().any(|s| s.contains(name)) {
                let count = count.clamp(0, MAX_PARTITIONS_PER_TOPIC);
                expected += count as usize;
                for p in 0..count {
                    let owner = &o[&(name.clone(), p)];
                    assert!(m[owner].contains(name), "{owner} not subscribed to {name}");
                }
            }
        }
        assert_eq!(o.len(), expected, "only existing subscribed partitions");
        assert!(out.values().all(|ts| ts.values().all(|s| !s.is_empty())));
    }

    /// Requirement 3: no partition could move to a subscriber with 2 fewer than its owner.
    fn check_local_balance(m: &Members, out: &TargetAssignment) {
        let counts: BTreeMap<&String, usize> = m.keys().map(|id| (id, held(out, id))).collect();
        for (owner, topics) in out {
            for topic in topics.keys() {
                for (other, _) in m.iter().filter(|(_, s)| s.contains(topic)) {
                    assert!(
                        counts[other] + 1 >= counts[owner],
                        "{topic}: {owner}>{other}"
                    );
                }
            }
        }
    }

    fn random_case(rng: &mut Rng, same: bool) -> (Members, Topics) {
        let topics: Topics = (0..1 + rng.below(20))
            .map(|i| (format!("t{i:02}"), 1 + rng.below(64) as i32))
            .collect();
        let pick = |rng: &mut Rng| -> BTreeSet<String> {
            topics
                .keys()
                .filter(|_| rng.below(3) == 0)
                .cloned()
                .collect()
        };
        let shared = pick(rng);
        let members = (0..rng.below(51))
            .map(|i| {
                (
                    format!("m{i:02}"),
                    if same { shared.clone() } else { pick(rng) },
                )
            })
            .collect();
        (members, topics)
    }

    fn owners_map(t: &Topics) -> BTreeMap<String, BTreeSet<i32>> {
        t.iter()
            .map(|(n, &c)| (n.clone(), (0..c).collect()))
            .collect()
    }

    fn moved(a: &TargetAssignment, b: &TargetAssignment) -> usize {
        let (a, b) = (owners(a), owners(b));
        b.iter()
            .filter(|(k, v)| a.get(*k).is_some_and(|o| o != *v))
            .count()
    }

    #[test]
    fn names() {
        for kind in [AssignorKind::Uniform, AssignorKind::Range] {
            assert_eq!(AssignorKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(AssignorKind::from_name("Uniform"), None);
        assert_eq!(AssignorKind::from_name("sticky"), None);
    }

    #[test]
    fn edge_inputs() {
        let none = TargetAssignment::new();
        for kind in [AssignorKind::Uniform, AssignorKind::Range] {
            assert!(run(kind, &Members::new(), &Topics::new(), &none).is_empty());
            let topics = Topics::from([
                ("zero".into(), 0),
                ("neg".into(), -5),
                ("huge".into(), i32::MAX),
                ("other".into(), 3),
            ]);
            let subs = |names: &[&str]| names.iter().map(|s| s.to_string()).collect();
            let members = Members::from([
                ("a".into(), subs(&["zero", "neg", "missing", "huge"])),
                ("b".into(), subs(&[])),
            ]);
            let stale = BTreeMap::from([("huge".into(), BTreeSet::from([-1, 0, i32::MAX]))]);
            let garbage =
                TargetAssignment::from([("gone".into(), stale.clone()), ("b".into(), stale)]);
            // Not `run`: checking a million partitions one by one is slow unoptimised.
            let spec = AssignmentSpec {
                members: &members,
                topics: &topics,
                previous: &garbage,
            };
            let out = assign(kind, &spec);
            assert!(out.keys().eq(["a", "b"]) && out["b"].is_empty());
            assert!(out["a"].keys().eq(["huge"]));
            let huge = &out["a"]["huge"];
            assert_eq!(huge.len(), MAX_PARTITIONS_PER_TOPIC as usize);
            assert_eq!(huge.last(), Some(&(MAX_PARTITIONS_PER_TOPIC - 1)));
        }
    }

    #[test]
    fn uniform_identical_random() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let (m, t) = random_case(&mut rng, true);
            let out = run(AssignorKind::Uniform, &m, &t, &TargetAssignment::new());
            let counts: Vec<usize> = m.keys().map(|id| held(&out, id)).collect();
            let (lo, hi) = (counts.iter().min(), counts.iter().max());
            assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1), "{counts:?}");
        }
    }

    #[test]
    fn uniform_heterogeneous_random() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for _ in 0..300 {
            let (m, t) = random_case(&mut rng, false);
            let first = run(AssignorKind::Uniform, &m, &t, &TargetAssignment::new());
            check_local_balance(&m, &first);
            // A balanced assignment is stable.
            assert_eq!(run(AssignorKind::Uniform, &m, &t, &first), first);
            // Rebalance after churn from a stale previous assignment.
            let (m2, _) = random_case(&mut rng, false);
            let second = run(AssignorKind::Uniform, &m2, &t, &first);
            check_local_balance(&m2, &second);
        }
    }

    #[test]
    fn uniform_sticky_join_and_leave() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for _ in 0..300 {
            let (mut m, t) = random_case(&mut rng, true);
            let before = run(AssignorKind::Uniform, &m, &t, &TargetAssignment::new());
            assert_eq!(run(AssignorKind::Uniform, &m, &t, &before), before);
            // Join: moves equal the minimum, the ceil slots going to the fullest members.
            let subs = m.values().next().cloned().unwrap_or_default();
            m.insert("joiner".into(), subs);
            let after = run(AssignorKind::Uniform, &m, &t, &before);
            let total: usize = m.keys().map(|id| held(&after, id)).sum();
            let (q, r) = (total / m.len(), total % m.len());
            let mut prev: Vec<usize> = before.keys().map(|id| held(&before, id)).collect();
            prev.sort_unstable_by(|a, b| b.cmp(a));
            let min: usize = prev
                .iter()
                .enumerate()
                .map(|(i, &c)| c.saturating_sub(q + usize::from(i < r)))
                .sum();
            assert_eq!(moved(&before, &after), min);
            // Leave: everyone else keeps what they had.
            let Some(leaver) = m.keys().next().cloned() else {
                continue;
            };
            m.remove(&leaver);
            let left = run(AssignorKind::Uniform, &m, &t, &after);
            for (id, topics) in &after {
                for (topic, parts) in topics.iter().filter(|_| *id != leaver) {
                    assert!(
                        parts.is_subset(&left[id][topic]),
                        "{id} lost part of {topic}"
                    );
                }
            }
        }
    }

    #[test]
    fn range_shape() {
        let mut rng = Rng(0x0bad_c0de_0123_4567);
        for i in 0..300 {
            let (m, t) = random_case(&mut rng, i % 2 == 0);
            let out = run(AssignorKind::Range, &m, &t, &TargetAssignment::new());
            for (topic, &count) in &t {
                let subs: Vec<&String> = m.keys().filter(|id| m[*id].contains(topic)).collect();
                let (count, n) = (count as usize, subs.len());
                let mut start = 0;
                for (k, id) in subs.into_iter().enumerate() {
                    let len = count / n + usize::from(k < count % n);
                    let got: Vec<i32> = out[id].get(topic).into_iter().flatten().copied().collect();
                    let want: Vec<i32> = (start as i32..(start + len) as i32).collect();
                    assert_eq!(got, want, "{topic} {id}");
                    start += len;
                }
            }
        }
    }

    #[test]
    fn large_group() {
        let topics: Topics = (0..10).map(|i| (format!("t{i}"), 1000)).collect();
        let all: BTreeSet<String> = topics.keys().cloned().collect();
        let mut m: Members = (0..100)
            .map(|i| (format!("m{i:03}"), all.clone()))
            .collect();
        let none = TargetAssignment::new();
        let out = run(AssignorKind::Uniform, &m, &topics, &none);
        assert!(m.keys().all(|id| held(&out, id) == 100));
        run(AssignorKind::Range, &m, &topics, &none);
        m.insert("m100".into(), all);
        let joined = run(AssignorKind::Uniform, &m, &topics, &out);
        assert_eq!(moved(&out, &joined), 99);
        let mut rng = Rng(42);
        for subs in m.values_mut() {
            subs.retain(|_| rng.below(2) == 0);
        }
        let hetero = run(AssignorKind::Uniform, &m, &topics, &joined);
        check_local_balance(&m, &hetero);
        // Worst case for the balancing loop: everything previously on one member.
        let all_on_one = TargetAssignment::from([("m000".into(), owners_map(&topics))]);
        check_local_balance(&m, &run(AssignorKind::Uniform, &m, &topics, &all_on_one));
    }
}
