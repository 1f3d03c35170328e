"""Timing collectives from CUDA-graph replays, shared by the GPU benches
(each runs as a script from bench/, so this module is found beside it).
torch is passed in: importing this imports nothing."""


def graph_timer(torch, dist, stream, iters):
    """(capture, replay_us) on stream: capture(fn) warms fn up outside the
    capture (first-use work), then records iters calls of it in a graph;
    replay_us(graph) lines the ranks up, replays it once and returns the
    GPU time per call in µs."""

    def capture(fn):
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(iters):
                fn()
        return graph

    def replay_us(graph):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # replay() runs on the current stream: make that the stream the
        # events are recorded on.
        with torch.cuda.stream(stream):
            a.record(stream)
            graph.replay()
            b.record(stream)
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / iters

    return capture, replay_us


def replay_round_robin(capture, replay_us, impls, reps, report):
    """Every implementation of impls (key -> fn) captured first, then reps
    replays round-robin (replay k of every implementation before replay
    k+1 of any), so that clock or neighbour drift during the run weighs on
    all of them alike rather than on whichever ran first. Returns key ->
    the µs per call of each replay; an implementation whose capture failed
    is left out, and report(key, exc) is told why."""
    graphs, times = {}, {}
    for key, fn in impls.items():
        try:
            graphs[key] = capture(fn)
            times[key] = []
        except Exception as exc:  # noqa: BLE001 - reported, the others still run
            report(key, exc)
    for _ in range(reps):
        for key, graph in graphs.items():
            times[key].append(replay_us(graph))
    return times
