package relay

import (
	"maps"
	"slices"
	"time"
)

// Timeouts bound the phases of one attempt. They are set globally
// (RetryConfig.AttemptTimeout, StreamConfig.FirstTokenTimeout,
// StreamConfig.IdleTimeout), per upstream (Upstream.Timeouts) and per model
// (Config.ModelTimeouts), so that a slow reasoning model and a fast chat
// model each get bounds that fit them.
//
// Each field is resolved on its own, for the attempt's candidate (its
// upstream and the model it is sent): the model's entry, else the
// upstream's, else the global setting. In Upstream.Timeouts and
// Config.ModelTimeouts, zero inherits and a negative duration turns the
// bound off for that scope. In a Decision, Timeouts are resolved: zero is
// no bound.
type Timeouts struct {
	// Attempt bounds the attempt's time to response headers
	// (ErrAttemptTimeout); the global one is RetryConfig.AttemptTimeout.
	Attempt time.Duration
	// FirstToken is the first-token failover timeout of a stream
	// (ErrFirstTokenTimeout); the global one is
	// StreamConfig.FirstTokenTimeout.
	FirstToken time.Duration
	// Idle fails a stream that sent nothing this long while the caller was
	// reading (ErrStreamStalled); the global one is
	// StreamConfig.IdleTimeout.
	Idle time.Duration
}

// over returns t with each zero field taken from wider, the scope t
// refines.
func (t Timeouts) over(wider Timeouts) Timeouts {
	return Timeouts{
		Attempt:    orDefault(t.Attempt, wider.Attempt),
		FirstToken: orDefault(t.FirstToken, wider.FirstToken),
		Idle:       orDefault(t.Idle, wider.Idle),
	}
}

// resolved turns the negative (off) fields of t into 0, the form the
// router reads: zero is no bound.
func (t Timeouts) resolved() Timeouts {
	return Timeouts{Attempt: max(t.Attempt, 0), FirstToken: max(t.FirstToken, 0), Idle: max(t.Idle, 0)}
}

// timeouts returns the timeouts of an attempt on c: its model's, over its
// upstream's, over the global ones. It is the one place an attempt reads
// them.
func (c *candidate) timeouts() Timeouts {
	if t, ok := c.up.byModel[c.model]; ok {
		return t
	}
	return c.up.timeouts
}

// resolveTimeouts checks the global, per-upstream and per-model timeouts of
// c and sets each upstream's resolved ones: its own over the global ones,
// and for each model of ModelTimeouts it serves, that model's over those.
func resolveTimeouts(c Config, ups []upstreamSettings, bad func(string, ...any)) {
	notNegative(bad, "Retry.AttemptTimeout", c.Retry.AttemptTimeout)
	notNegative(bad, "Stream.FirstTokenTimeout", c.Stream.FirstTokenTimeout)
	global := Timeouts{
		Attempt:    c.Retry.AttemptTimeout,
		FirstToken: c.Stream.FirstTokenTimeout,
		Idle:       orDefault(c.Stream.IdleTimeout, 25*time.Second),
	}
	served := servedModels(c.Upstreams)
	for _, m := range slices.Sorted(maps.Keys(c.ModelTimeouts)) {
		switch {
		case m == "":
			bad("ModelTimeouts has an entry for the empty model name")
		case served != nil && len(c.Upstreams) > 0 && !served[m]:
			bad("ModelTimeouts[%q] is for a model no upstream serves (none lists it in Models)", m)
		}
	}
	for i := range ups {
		u := &ups[i]
		own := u.cfg.Timeouts.over(global)
		u.timeouts = own.resolved()
		for m, t := range c.ModelTimeouts {
			if u.models != nil && !u.models[m] {
				continue
			}
			if u.byModel == nil {
				u.byModel = make(map[string]Timeouts, len(c.ModelTimeouts))
			}
			u.byModel[m] = t.over(own).resolved()
		}
	}
}
