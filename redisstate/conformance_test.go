package redisstate

import (
	"testing"

	"github.com/tokenrelay/relay/store"
	"github.com/tokenrelay/relay/store/storetest"
)

// TestConformance runs the store contract's suite against the State, on
// miniredis and, when one answers, on a real redis-server: the same
// behaviours store.Local has.
func TestConformance(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		storetest.Run(t, func(t *testing.T) store.State { return b.state(t) })
	})
}
