//! Progress for humans: an indicatif bar on a terminal; in a batch job (no
//! TTY, e.g. SLURM's output file) a plain log line every few seconds instead,
//! so logs stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    last_log: std::cell::Cell<Instant>,
    started: Instant,
    start_step: u64,
    max_steps: u64,
}

impl Progress {
    pub fn new(step: u64, max_steps: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(max_steps).with_position(step);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} step {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]")
                    .expect("valid template"),
            );
            bar
        });
        Progress {
            bar,
            last_log: std::cell::Cell::new(Instant::now()),
            started: Instant::now(),
            start_step: step,
            max_steps,
        }
    }

    pub fn update(&self, step: u64, loss: f64) {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let rate = (step - self.start_step) as f64 / elapsed;
        match &self.bar {
            Some(bar) => {
                bar.set_position(step);
                bar.set_message(format!("loss {loss:.4} {rate:.1} steps/s"));
            }
            None => {
                if self.last_log.get().elapsed() >= LOG_EVERY || step == self.max_steps {
                    self.last_log.set(Instant::now());
                    let eta = if rate > 0.0 { (self.max_steps - step) as f64 / rate } else { f64::NAN };
                    tracing::info!(
                        step,
                        max_steps = self.max_steps,
                        loss = format!("{loss:.4}"),
                        steps_per_s = format!("{rate:.2}"),
                        eta_s = format!("{eta:.0}"),
                        "progress"
                    );
                }
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
