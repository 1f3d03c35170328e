package symm

// Note [Descriptor paths]
//
// A descriptorPath carries what a peer needs to map our memory (the signal
// pad, segments) to the ranks that lack it, on one kind of link, and maps
// what arrives; the group's phases that move memory (the descriptor
// exchange of a rendezvous or of group creation, Note [Descriptor exchange
// phases]; the remapping of a resume, Note [Resume phases]) run each path
// of g.paths in order instead of asking which links the group has. The
// paths, chosen once from the teams when the group is made (pathsFor):
//
//	socketPath  (sockets_path.go) descriptors over this machine's Unix
//	            sockets with SCM_RIGHTS, to the ranks of our team on our
//	            machine; every group has it, first.
//	fabricPath  (fabric_path.go) fabric handles through the group's
//	            all-gather, to the ranks of our team on other machines
//	            (Note [Fabric teams]); only where some team spans machines.
//
// Each path keeps the phases' contract: a returned error ends the call at
// once (the exchange returns it, the resume undoes what was remapped and
// pauses again); a failure of this rank alone goes to the call's local
// error, for the shared verdict. An NCCL communicator carries no
// descriptors: its windows are a registration beside the paths (Note [NCCL
// groups]).
type descriptorPath interface {
	// exchange is this path's part of an exchangeCall.
	exchange(x *exchangeCall) error
	// resume is this path's part of a resumeCall.
	resume(c *resumeCall) error
}

// socketPath carries descriptors over this machine's Unix sockets
// (SCM_RIGHTS), between the ranks of our team on our machine (bySocket);
// every group has it. Its steps are in sockets_path.go.
type socketPath struct{}

// fabricPath carries fabric handles through the group's all-gather, between
// the ranks of a team on different machines (crossTeam); groups where
// t.fabricSpan have it, after socketPath. Its steps are in fabric_path.go.
type fabricPath struct{}

// pathsFor is the descriptor paths of a group with teams t.
func pathsFor(t *teams) []descriptorPath {
	paths := []descriptorPath{socketPath{}}
	if t.fabricSpan {
		paths = append(paths, fabricPath{})
	}
	return paths
}
