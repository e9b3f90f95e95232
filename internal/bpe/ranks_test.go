package bpe

import "testing"

func TestLoadRanksRejects(t *testing.T) {
	good := ranksMagic + "\x03\x00\x00\x00\x02\x00\x00\x00" + "\x01\x02\x00\x00a" + "\x02\x00\x00\x00bc"
	tb, err := loadRanks("x", good)
	if err != nil {
		t.Fatalf("good file: %v", err)
	}
	if tb.get("a") != 2 || tb.get("bc") != 0 || tb.get("b") != noRank {
		t.Fatal("good file: wrong ranks")
	}
	for _, bad := range []string{"", "bpe2", "bpe0" + good[4:], good[:len(good)-1], good + "z",
		good[:4] + "\x02" + good[5:], // rank 2 out of range
		good[:8] + "\x04" + good[9:], // more tokens than ranks
	} {
		if _, err := loadRanks("x", bad); err == nil {
			t.Errorf("loadRanks(%q) accepted", bad)
		}
	}
}
