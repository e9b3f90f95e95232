package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFailoverUnderTraffic: with the hold (the default), every stream that
// failed before its first content is recovered on another upstream and
// the caller sees none fail; with the hold off, the same faults reach the
// caller.
func TestFailoverUnderTraffic(t *testing.T) {
	o := options{n: 120, conc: 8, fail: 0.3, seed: 1, held: true}
	held, err := run(o)
	require.NoError(t, err)
	assert.Positive(t, held.failedEarly)
	assert.Equal(t, held.failedEarly, held.recovered)
	assert.Zero(t, held.callerFailed)
	var out bytes.Buffer
	held.print(&out, o)
	m := regexp.MustCompile(`failed-before-content streams recovered: (\d+) of (\d+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	assert.Equal(t, m[1], m[2])

	o.held = false
	direct, err := run(o)
	require.NoError(t, err)
	assert.Positive(t, direct.callerFailed, "without the hold the faults reach the caller")
	assert.Zero(t, direct.recovered)
}
