package core

import "testing"

func TestRanksByValue(t *testing.T) {
	vals := []string{"a", "b", "a", "c"}
	if got := RanksByValue(4, func(r int) string { return vals[r] }); got != "ranks 0, 2: a; rank 1: b; rank 3: c" {
		t.Fatal(got)
	}
	if got := RanksByValue(3, func(int) string { return "x" }); got != "" {
		t.Fatal(got)
	}
	if got := RanksText([]int{0, 2, 5}); got != "0, 2, 5" {
		t.Fatal(got)
	}
}
