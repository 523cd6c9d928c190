//! The moving figures: the movers' progress folded into the status (what the receiver wrote is
//! the truth; totals, percent, throughput, ETA, wire bytes), and whether data moves at all.

use super::*;

/// Whether the current attempt's movers report that data moves (connected, past the handshake).
pub(super) fn moving_data(obs: &Observed) -> bool {
    let moving = |u: &Option<ProgressUpdate>| {
        u.as_ref().is_some_and(|u| {
            matches!(
                MoverPhase::try_from(u.phase),
                Ok(MoverPhase::Transferring | MoverPhase::Finishing | MoverPhase::Succeeded)
            )
        })
    };
    moving(&obs.sender_progress) || moving(&obs.receiver_progress)
}

/// Folds the movers' latest updates into status. The receiver's figures (what was written) are
/// the truth; the totals come from the sender, which walks the source. Missing updates keep the
/// previous figures, so a finished Transfer keeps its totals.
pub fn fold_progress(st: &mut TransferStatus, obs: &Observed) {
    let (recv, send) = (obs.receiver_progress.as_ref(), obs.sender_progress.as_ref());
    if let Some(u) = send.filter(|u| u.unreadable_count > 0) {
        st.unreadable = Some(UnreadableStatus {
            count: u.unreadable_count,
            paths: u.unreadable_paths.iter().take(100).cloned().collect(),
        });
    }
    if recv.is_none() && send.is_none() {
        return;
    }
    let done = recv.or(send);
    let mut p = st.progress.clone().unwrap_or_default();
    if let Some(d) = done {
        p.bytes_done = d.bytes_done;
        p.files_done = d.files_done;
        p.files_skipped = d.skipped;
    }
    if let Some(s) = send {
        p.bytes_total = s.bytes_total.max(p.bytes_total);
        p.files_total = s.files_total.max(p.files_total);
        p.totals_final = s.totals_final;
    }
    p.bytes_total = p.bytes_total.max(p.bytes_done);
    p.files_total = p.files_total.max(p.files_done + p.files_skipped);
    p.percent = percent(&p);
    p.display = format!("{}%", p.percent);
    st.progress = Some(p.clone());

    if let Some(d) = done {
        let running = MoverPhase::try_from(d.phase).is_ok_and(|ph| {
            matches!(
                ph,
                MoverPhase::Transferring | MoverPhase::Finishing | MoverPhase::Connecting
            )
        });
        let avg = d.throughput_average.max(0.0) as u64;
        let cur = if running {
            d.throughput_current.max(0.0) as u64
        } else {
            0
        };
        st.throughput = Some(ThroughputStatus {
            current_bytes_per_second: cur,
            average_bytes_per_second: avg,
            display: human_rate(if running { cur } else { avg }),
        });
        st.eta = (running && p.totals_final && avg > 0)
            .then(|| human_duration(p.bytes_total.saturating_sub(p.bytes_done) / avg));
    }
    if let Some(r) = recv {
        let ratio = if r.wire_bytes > 0 {
            format!("{:.2}", r.bytes_done as f64 / r.wire_bytes as f64)
        } else {
            "0".into()
        };
        st.wire = Some(WireStatus {
            bytes: r.wire_bytes,
            compression_ratio: ratio,
            dedup_blocks: r.dedup_blocks,
            dedup_bytes: r.dedup_bytes,
            resumed_bytes: r.resumed_bytes,
        });
    }
}

pub fn percent(p: &ProgressStatus) -> u32 {
    let pct = (p.bytes_done.saturating_mul(100))
        .checked_div(p.bytes_total)
        .or_else(|| {
            (p.files_done + p.files_skipped)
                .saturating_mul(100)
                .checked_div(p.files_total)
        })
        .unwrap_or(0);
    // 100 % only once the totals are final and everything is in.
    let complete = p.totals_final && p.bytes_done >= p.bytes_total;
    (pct.min(if complete { 100 } else { 99 })) as u32
}
