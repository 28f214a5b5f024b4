"""Zero-copy exchange with PyTorch and numpy, and the model's numbers against tests/oracle's independent
PyTorch GPT-2 and Llama: forward's logits, state_dict into the oracle, load_state_dict from torch tensors."""
import ctypes
import gc

import anvil
import numpy as np
import pytest

torch = pytest.importorskip("torch")
TOL = 1e-4


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, oracles):
    gpt2, _ = oracles
    torch.manual_seed(5)
    p = gpt2.make_params()
    d = tmp_path_factory.mktemp("gpt2") / "model"
    gpt2.write_model(str(d), p)
    return d, {k: v.detach() for k, v in p.items()}


def test_forward_shares_memory_with_torch_and_numpy(trained):
    m = anvil.Model.load(trained, threads=2)
    t = m.forward([[1, 2, 3], [4, 5, 6]])
    assert t.shape == (2, 3, 257) and t.dtype == "float32" and t.device == "cpu"
    x = torch.from_dlpack(t)
    a = np.asarray(t)
    assert x.data_ptr() == t.data_ptr() == a.ctypes.data
    x[0, 0, 0] = 123.0  # a write on one side is seen on the others
    assert a[0, 0, 0] == 123.0
    keep = x.clone()
    del m, t, a
    gc.collect()
    assert torch.equal(x, keep)  # the storage outlived the model and the anvil.Tensor


def test_dlpack_capsules():
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    t = anvil.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert get_name(t.__dlpack__()) == b"dltensor"  # what torch 1.13 reads
    assert get_name(t.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert t.__dlpack_device__() == (1, 0)
    # a torch tensor in, without a copy, and back out
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w = anvil.from_dlpack(src)
    assert w.data_ptr() == src.data_ptr() and w.shape == (3, 4)
    assert torch.from_dlpack(w).data_ptr() == src.data_ptr()
    with pytest.raises(anvil.InputError, match="not contiguous"):
        anvil.from_dlpack(src.t())
    with pytest.raises(anvil.InputError, match="dtype"):
        anvil.from_dlpack(np.zeros(3, dtype=np.float64))


def test_gpt2_logits_match_the_oracle(gpt2_dir, oracles):
    gpt2, _ = oracles
    d, p = gpt2_dir
    m = anvil.Model.load(d, tokenizer="byte", threads=2)
    idx = torch.randint(0, gpt2.V, (3, 20), generator=torch.Generator().manual_seed(1))
    got = torch.from_dlpack(m.forward(idx.numpy()))
    with torch.no_grad():
        want = gpt2.forward(p, idx)
    assert rel_err(got, want) < TOL
    # score: each token's log-softmax under the same logits
    s = m.score("abc de")
    ids = [gpt2.EOT] + list(b"abc de")
    with torch.no_grad():
        lsm = gpt2.forward(p, torch.tensor([ids[:-1]])).log_softmax(-1)[0]
    want_lp = lsm[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert s.tokens.tolist() == ids[1:]
    assert np.allclose(s.logprobs, want_lp.numpy(), rtol=TOL, atol=TOL)


def test_precision_bf16_on_the_cpu_is_autocast(gpt2_dir, oracles):
    gpt2, _ = oracles
    d, p = gpt2_dir
    idx = torch.randint(0, gpt2.V, (2, 16), generator=torch.Generator().manual_seed(2))
    f32 = torch.from_dlpack(anvil.Model.load(d, tokenizer="byte", threads=2).forward(idx.numpy()))
    try:
        m = anvil.Model.load(d, tokenizer="byte", threads=2, precision="bf16")
    except anvil.InputError as e:
        assert "oneDNN" in str(e)
        pytest.skip("this build has no oneDNN")
    got = torch.from_dlpack(m.forward(idx.numpy()))
    assert got.dtype == torch.float32 and not torch.equal(got, f32)  # bf16 products, f32 logits
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = gpt2.forward(p, idx).float()
    assert rel_err(got, f32) < 5e-2 and rel_err(got, want) < 5e-2
    with pytest.raises(anvil.InputError, match="fp16"):
        anvil.Model.load(d, tokenizer="byte", device="cpu", precision="fp16")


def test_state_dict_runs_in_the_oracle_and_loads_back_bit_for_bit(gpt2_dir, oracles):
    gpt2, _ = oracles
    d, _ = gpt2_dir
    m = anvil.Model.load(d, tokenizer="byte", threads=2)
    sd = {k: torch.from_dlpack(v) for k, v in m.state_dict().items()}
    idx = torch.randint(0, gpt2.V, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel_err(torch.from_dlpack(m.forward(idx.numpy())), gpt2.forward(sd, idx)) < TOL
    # new weights from torch, in; read back bit for bit; the oracle agrees on the new logits
    torch.manual_seed(9)
    new = {k: v.detach() for k, v in gpt2.make_params().items()}
    missing, unexpected = m.load_state_dict(new)
    assert not missing and not unexpected
    for k, v in m.state_dict().items():
        assert torch.equal(torch.from_dlpack(v), new[k]), k
    with torch.no_grad():
        assert rel_err(torch.from_dlpack(m.forward(idx.numpy())), gpt2.forward(new, idx)) < TOL
    with pytest.raises(anvil.InputError, match="missing"):
        m.load_state_dict({"transformer.wte.weight": new["transformer.wte.weight"]})
    with pytest.raises(anvil.InputError, match="is \\(257, 32\\) here"):
        m.load_state_dict({"transformer.wte.weight": torch.zeros(3, 3)}, strict=False)


def test_llama_logits_match_the_oracle(tmp_path, oracles):
    _, llama = oracles
    torch.manual_seed(11)
    c = llama.Cfg()
    p = {k: v.detach() for k, v in llama.make_params(c).items()}
    llama.write_model(str(tmp_path / "llama"), c, p)
    m = anvil.Model.load(tmp_path / "llama", threads=2)
    idx = torch.randint(0, llama.V, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = llama.forward(c, p, idx)
    assert rel_err(torch.from_dlpack(m.forward(idx.numpy())), want) < TOL
    sd = {k: torch.from_dlpack(v) for k, v in m.state_dict().items()}
    assert set(sd) == set(p) and all(torch.equal(sd[k], p[k]) for k in p)
