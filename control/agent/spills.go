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
// SNAT flows. The first check waits until no program of an older datapath,
// which spilled without marking, runs here any more: the NICs' were
// replaced before Run, the pod interfaces' in the first pass of watchPods.
// (One left on an interface the agent no longer serves could still spill
// unmarked; the flow whose port a claim then gives out twice moves to a
// new port at its next check, within a second.) It checks again every
// interval until the marks are trusted: an unmarked spill keeps them
// untrusted until its flow ends or is evicted.
func (a *Agent) trustSNATSpillMarks(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.podsListed:
	}
	tick := time.NewTicker(a.spillCheckEvery)
	defer tick.Stop()
	for {
		trusted, err := a.plane.TrustSNATSpillMarks()
		switch {
		case err != nil:
			a.log.Warn("check SNAT spill marks", "error", err, "retry_in", a.spillCheckEvery)
		case trusted:
			a.log.Info("SNAT spill marks trusted: new flows look up the NAT map only for marked ports")
			return
		default:
			a.log.Info("SNAT spill marks not trusted yet: the NAT map holds a spill an older datapath left unmarked",
				"retry_in", a.spillCheckEvery)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
