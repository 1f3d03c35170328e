package core

import (
	"fmt"
	"sort"
	"strings"
)

// RanksText names ranks for messages: "0, 2, 5".
func RanksText(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}

// RanksByValue describes how ranks 0..world-1 split over the values
// val(r), the largest group first: "ranks 0, 2: A; rank 1: B". It returns
// "" when every rank has the same value.
func RanksByValue(world int, val func(r int) string) string {
	groups := map[string][]int{}
	var order []string
	for r := 0; r < world; r++ {
		v := val(r)
		if _, ok := groups[v]; !ok {
			order = append(order, v)
		}
		groups[v] = append(groups[v], r)
	}
	if len(order) <= 1 {
		return ""
	}
	sort.SliceStable(order, func(i, j int) bool { return len(groups[order[i]]) > len(groups[order[j]]) })
	parts := make([]string, len(order))
	for i, v := range order {
		word := "rank"
		if len(groups[v]) > 1 {
			word = "ranks"
		}
		parts[i] = fmt.Sprintf("%s %s: %s", word, RanksText(groups[v]), v)
	}
	return strings.Join(parts, "; ")
}
