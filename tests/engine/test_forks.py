import torch

from ssd.engine.forks import select_forks


def random_case(K=4, V=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(K + 1, V, generator=g), dim=-1)
    drafted = probs[:K].argmax(dim=-1)
    return probs, drafted


def test_forks_never_contain_the_drafted_token_before_the_bonus_position():
    for seed in range(20):
        probs, drafted = random_case(seed=seed)
        forks = select_forks(probs, drafted, [5, 4, 3, 2, 6])
        for j, t in forks:
            if j < 4:
                assert t != int(drafted[j])


def test_bonus_position_can_fork_on_any_token():
    probs, drafted = random_case()
    probs[4] = 0.0
    probs[4, int(drafted[3])] = 1.0
    forks = select_forks(probs, drafted, [0, 0, 0, 0, 1])
    assert forks == [(4, int(drafted[3]))]


def test_fork_counts_equal_the_fanout_and_pick_the_most_probable():
    probs, drafted = random_case()
    fanout = [5, 4, 3, 2, 6]
    forks = select_forks(probs, drafted, fanout)
    assert [sum(1 for j, _ in forks if j == pos) for pos in range(5)] == fanout
    for pos, f in enumerate(fanout):
        row = probs[pos].clone()
        if pos < 4:
            row[drafted[pos]] = -1.0
        expected = row.topk(f).indices.tolist()
        assert [t for j, t in forks if j == pos] == expected


def test_fork_counts_are_capped_by_the_vocabulary():
    probs, drafted = random_case(K=2, V=4)
    forks = select_forks(probs, drafted, [9, 9, 9])
    assert [sum(1 for j, _ in forks if j == pos) for pos in range(3)] == [3, 3, 4]
    assert len(set(forks)) == len(forks)


def test_ties_break_toward_the_lower_token_id_deterministically():
    probs = torch.tensor([[0.1, 0.3, 0.3, 0.3], [0.25, 0.25, 0.25, 0.25]])
    drafted = torch.tensor([2])
    assert select_forks(probs, drafted, [2, 3]) == [(0, 1), (0, 3), (1, 0), (1, 1), (1, 2)]


def test_zero_fanout_and_k_zero():
    probs, drafted = random_case(K=0)
    assert select_forks(probs, drafted, [0]) == []
    assert select_forks(probs, drafted, [2]) == [(0, t) for t in probs[0].topk(2).indices.tolist()]
