//! How a batch's tasks land on workers, and how far that is from the best possible.
//!
//! Workers place themselves: a worker with a free slot claims the ready task of highest rank,
//! and among a job's tasks the one with the most estimated rows first (`worker.rs`), while the
//! least-loaded rule (`model::may_claim`) keeps a fast, empty worker ahead of a loaded one. For
//! one batch this is list scheduling in longest-first order on machines of unequal speed:
//! [`simulate`] replays it, and [`lower_bound`] is the best finish time any placement could
//! reach, even one allowed to cut tasks apart. The simulation test places 1,000 tasks of skewed
//! sizes on 20 unequal workers and holds the rule within 1.15× of that bound (BENCHMARKS.md).

/// A worker as placement sees it: slots that run one task each, at a speed (rows per second per
/// slot, the worker's weight).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slots {
    pub count: usize,
    pub speed: f64,
}

/// Which slot takes the next task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The slot that frees first (the fastest among equals): what self-claiming workers do.
    FirstFree,
    /// The slot that would end the task first: what a leader that knew every speed could do.
    EarliestFinish,
}

/// The finish time of placing `tasks` (estimated rows each) in the order given, by `rule`.
pub fn simulate(tasks: &[f64], workers: &[Slots], rule: Rule) -> f64 {
    // Every slot's time when it is free again, and its speed.
    let mut slots: Vec<(f64, f64)> =
        workers.iter().flat_map(|worker| std::iter::repeat_n((0.0, worker.speed), worker.count)).collect();
    let mut finish: f64 = 0.0;
    for &work in tasks {
        let (index, _) = slots
            .iter()
            .enumerate()
            .map(|(index, (free, speed))| match rule {
                Rule::FirstFree => (index, (*free, -speed)),
                Rule::EarliestFinish => (index, (free + work / speed, 0.0)),
            })
            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0).then(a.1 .1.total_cmp(&b.1 .1)))
            .expect("at least one slot");
        slots[index].0 += work / slots[index].1;
        finish = finish.max(slots[index].0);
    }
    finish
}

/// The longest-first order the workers claim in.
pub fn longest_first(tasks: &[f64]) -> Vec<f64> {
    let mut sorted = tasks.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted
}

/// No placement finishes before this: the optimum when tasks may be cut and moved between slots
/// (uniform machines, preemptive): for every k, the k largest tasks need at least their work
/// over the k fastest slots' speed, and all tasks the total over every slot's.
pub fn lower_bound(tasks: &[f64], workers: &[Slots]) -> f64 {
    let sorted = longest_first(tasks);
    let mut speeds: Vec<f64> =
        workers.iter().flat_map(|worker| std::iter::repeat_n(worker.speed, worker.count)).collect();
    speeds.sort_by(|a, b| b.total_cmp(a));
    let (total_work, total_speed): (f64, f64) = (sorted.iter().sum(), speeds.iter().sum());
    let mut bound = total_work / total_speed;
    let (mut work, mut speed) = (0.0, 0.0);
    for (task, slot) in sorted.iter().zip(&speeds) {
        work += task;
        speed += slot;
        bound = bound.max(work / speed);
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (SplitMix64), so the figures repeat.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// 1,000 tasks of Pareto-distributed rows (shape 1.5: many small tables, a few 20 times
    /// larger; capped there, as the planner cuts a larger table into groups of splits), and 20
    /// workers of 1 to 8 slots at speeds 0.5 to 2.
    fn scenario(seed: u64) -> (Vec<f64>, Vec<Slots>) {
        let mut random = Random(seed);
        let tasks = (0..1_000).map(|_| (10_000.0 / (1.0 - random.next()).powf(1.0 / 1.5)).min(200_000.0)).collect();
        let workers = (0..20)
            .map(|_| Slots { count: 1 + (random.next() * 8.0) as usize, speed: 0.5 + random.next() * 1.5 })
            .collect();
        (tasks, workers)
    }

    #[test]
    fn the_claim_order_finishes_within_15_percent_of_the_best_possible() {
        let mut worst: f64 = 0.0;
        for seed in 1..=20 {
            let (tasks, workers) = scenario(seed);
            let bound = lower_bound(&tasks, &workers);
            let sorted = longest_first(&tasks);
            let claimed = simulate(&sorted, &workers, Rule::FirstFree) / bound;
            let finish = simulate(&sorted, &workers, Rule::EarliestFinish) / bound;
            let arrival = simulate(&tasks, &workers, Rule::FirstFree) / bound;
            println!(
                "seed {seed}: longest first, first free slot {claimed:.3}× the bound; earliest finish {finish:.3}×; \
                 in arrival order {arrival:.3}×"
            );
            assert!(claimed >= 1.0 - 1e-9 && finish >= 1.0 - 1e-9, "the bound is a bound");
            worst = worst.max(claimed);
        }
        println!("worst of 20 scenarios, as the workers claim: {worst:.3}×");
        assert!(worst <= 1.15, "longest first reached {worst:.3}× the lower bound");
    }

    #[test]
    fn the_bound_is_tight_where_it_can_be() {
        let workers = [Slots { count: 2, speed: 1.0 }];
        assert_eq!(lower_bound(&[4.0, 4.0], &workers), 4.0);
        assert_eq!(simulate(&[4.0, 4.0], &workers, Rule::FirstFree), 4.0);
        // One huge task bounds everything, however many slots there are.
        let many = [Slots { count: 10, speed: 2.0 }];
        assert_eq!(lower_bound(&[100.0, 1.0, 1.0], &many), 50.0);
        assert_eq!(simulate(&[100.0, 1.0, 1.0], &many, Rule::FirstFree), 50.0);
    }
}
