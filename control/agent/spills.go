package agent

import (
	"context"
	"time"
)

// snatSpillCheckEvery is how often the agent checks again whether the
// datapath can trust its SNAT spill marks, until it can.
const snatSpillCheckEvery = time.Minute

// trustSNATSpillMarks lets the datapath trust its SNAT spill marks (see
// dataplane.TrustSNATSpillMarks), which saves a NAT map lookup on most new
// SNAT flows. A program of an older datapath spills without marking, so
// the marks are trusted only while every pinned XDP and TC attachment runs
// this datapath's programs: the first check waits for the first pass over
// the pod interfaces (the NICs' programs were replaced before Run). The
// check repeats every interval until the marks are trusted; until then an
// attachment left by an earlier agent, or a live flow's unmarked spill,
// keeps them untrusted.
func (a *Agent) trustSNATSpillMarks(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.podsListed:
	}
	tick := time.NewTicker(a.spillCheckEvery)
	defer tick.Stop()
	for {
		if a.checkSNATSpillMarks() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// checkSNATSpillMarks runs one check and reports whether the marks are
// trusted now.
func (a *Agent) checkSNATSpillMarks() bool {
	defer a.spillChecks.Add(1)
	foreign, err := a.dp.ForeignAttachments()
	if err != nil {
		a.log.Warn("check SNAT spill marks: list attachments", "error", err, "retry_in", a.spillCheckEvery)
		return false
	}
	if len(foreign) > 0 {
		a.log.Info("SNAT spill marks not trusted yet: attachments run another datapath's programs",
			"links", foreign, "retry_in", a.spillCheckEvery)
		return false
	}
	trusted, deleted, err := a.plane.TrustSNATSpillMarks()
	if deleted > 0 {
		a.log.Info("ended flows' unmarked SNAT spills deleted", "entries", deleted)
	}
	switch {
	case err != nil:
		a.log.Warn("check SNAT spill marks", "error", err, "retry_in", a.spillCheckEvery)
	case trusted:
		a.log.Info("SNAT spill marks trusted: new flows look up the NAT map only for marked ports")
	default:
		a.log.Info("SNAT spill marks not trusted yet: a live flow's spill has no mark (its next packet or reply adds one)",
			"retry_in", a.spillCheckEvery)
	}
	return trusted
}
