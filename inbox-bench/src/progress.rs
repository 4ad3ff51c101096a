//! Progress while the harness runs: a bar for the whole run and one for the step at hand,
//! so that a long run never looks hung. Where stderr is not a terminal the bars are
//! hidden and each finished step prints a line instead.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

pub struct Progress {
    bars: MultiProgress,
    overall: ProgressBar,
}

impl Progress {
    pub fn new(measurements: u64) -> Self {
        let bars = MultiProgress::new();
        let overall = bars.add(ProgressBar::new(measurements));
        overall.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} measurements {pos}/{len} [{bar:30}] {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        overall.enable_steady_tick(Duration::from_millis(500));
        Self { bars, overall }
    }

    /// A bar for one step of `len` units, such as deliveries or rows.
    pub fn step(&self, name: String, len: u64) -> ProgressBar {
        let bar = self.bars.add(ProgressBar::new(len));
        bar.set_style(
            ProgressStyle::with_template(
                "  {prefix} [{bar:30}] {human_pos}/{human_len} eta {eta} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(name);
        bar
    }

    /// Ends a step, leaving `line` behind it.
    pub fn finish_step(&self, bar: ProgressBar, line: String) {
        bar.finish_and_clear();
        self.bars.remove(&bar);
        self.note(line);
    }

    /// Counts a finished measurement.
    pub fn measured(&self) {
        self.overall.inc(1);
    }

    /// Prints a line above the bars, or plainly where they are hidden.
    pub fn note(&self, line: String) {
        if self.bars.is_hidden() {
            eprintln!("{line}");
        } else {
            // Only fails when the terminal is gone.
            let _ = self.bars.println(line);
        }
    }

    pub fn finish(&self) {
        self.overall.finish_and_clear();
    }
}
