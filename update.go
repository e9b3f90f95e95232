package relay

import (
	"errors"
	"fmt"
)

// Update replaces the router's configuration with cfg while it serves,
// keeping what the router learned. It checks cfg as New does, with the
// same errors, and on an error changes nothing.
//
// Every request that starts after Update returns uses cfg; a request that
// started before keeps the configuration it started with to its end (its
// retries, hedges, reports and hooks included). Upstreams are known by
// Name: one whose Name stays keeps its circuit, latency window, counters,
// in-flight requests and the requests queued for its limits and slots,
// whatever else of it changed (a new APIKey, BaseURL, Header or
// BodyTags is used by the requests that start afterwards; new RPM and TPM
// apply to the buckets as they are, which keep the share of a minute's
// quota they had; a new MaxInFlight resizes its slots, and a cap set on an
// upstream that had none counts the requests admitted from then on). An
// upstream no longer in cfg gets no new request: the requests in flight
// on it finish as they would have. A new one starts with nothing learned.
// The store keeps its limits and circuits by name (see package store): an
// upstream removed and added again finds them as the store left them.
//
// What the router as a whole learned is kept too: the hedge budget's
// balance, the memo of token counts (renewed when MemoEntries or
// ImageTokens change), the budgets' ledgers and the store.
//
// Clock, State and Ledger cannot change: everything the router keeps is
// timed by its Clock and kept in its State and Ledger. An Update that
// changes one fails with ErrNotUpdatable, naming it; make a new Router
// for that. Updates are applied one at a time, and Update is safe to call
// while requests are in flight, from any goroutine.
func (r *Router) Update(cfg Config) error {
	s, err := resolve(cfg)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.current()
	if err := fixed(&was.s, &s); err != nil {
		return err
	}
	g := &Router{s: s, stores: was.stores, ids: was.ids, hedges: was.hedges, counter: was.counter}
	if s.memoEntries != was.s.memoEntries || s.imageTokens != was.s.imageTokens {
		g.counter = newCounter(s.memoEntries, s.imageTokens) // the memo's counts were made with the old ones
	}
	g.hedges.deposit.Store(s.hedge.deposit)
	g.initUpstreams(was)
	r.live.Store(g)
	return nil
}

// fixed reports the settings of s that differ from those of was and that
// no Update can change.
func fixed(was, s *settings) error {
	var errs []error
	for _, f := range [...]struct {
		name, why string
		a, b      any
	}{
		{"Clock", "every time the router keeps is on it", was.clock, s.clock},
		{"State", "it keeps the upstreams' limits and circuits", was.state, s.state},
		{"Ledger", "it keeps the budgets' spend", was.ledger, s.ledger},
	} {
		if !same(f.a, f.b) {
			errs = append(errs, &notUpdatableError{field: f.name, why: f.why})
		}
	}
	return errors.Join(errs...)
}

// same reports whether a and b are the same value: the same pointer, or
// equal values of one comparable type. Values that cannot be compared
// are not the same.
func same(a, b any) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false // (a type that is not comparable)
		}
	}()
	return a == b
}

// notUpdatableError is ErrNotUpdatable for one setting.
type notUpdatableError struct{ field, why string }

func (e *notUpdatableError) Error() string {
	return fmt.Sprintf("relay: Update cannot change Config.%s (%s): make a new Router", e.field, e.why)
}

func (e *notUpdatableError) Unwrap() error { return ErrNotUpdatable }
