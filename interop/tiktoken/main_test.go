package tiktoken

import (
	"sync"
	"testing"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
	"go.uber.org/goleak"

	. "github.com/tokenrelay/relay/internal/bpe"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var refOnce sync.Once

// reference returns tiktoken-go's encoder for name (offline assets only).
func reference(tb testing.TB, name string) *tiktoken.Tiktoken {
	tb.Helper()
	refOnce.Do(func() { tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader()) })
	enc, err := tiktoken.GetEncoding(name)
	if err != nil {
		tb.Fatalf("tiktoken-go %s: %v", name, err)
	}
	return enc
}

func encodings() []*Encoding { return []*Encoding{CL100K(), O200K()} }
