"""Where ``rstitch serve --replicas N`` puts its replicas: one GPU each with a CUDA device (Ray then shows each
replica its own GPU as cuda:0), none on CPU, and what ``--gpus-per-replica`` says when given."""

from __future__ import annotations

import pytest

from hf_rstitch.serve.config import ServeConfig


@pytest.mark.parametrize("device, given, want", [("cuda", None, 1.0), ("cuda:0", None, 1.0), ("cpu", None, 0.0),
                                                 ("cuda", 0.5, 0.5), ("cuda", 2.0, 2.0), ("cpu", 0.0, 0.0)])
def test_one_gpu_a_replica_by_default_on_cuda(device, given, want):
    assert ServeConfig(device=device, replicas=2, gpus_per_replica=given).replica_gpus == want


def test_replica_device_must_be_its_own_gpu():
    with pytest.raises(ValueError, match="--device cuda"):
        ServeConfig(device="cuda:1", replicas=2)
    with pytest.raises(ValueError, match="--gpus-per-replica must be >= 0"):
        ServeConfig(gpus_per_replica=-1)


def test_ray_deployment_reserves_one_gpu_a_replica():
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'hf-rstitch[serve-ray]'")
    from hf_rstitch.serve import replicas

    opts = replicas.deployment(ServeConfig(device="cuda", replicas=2)).ray_actor_options
    assert opts["num_gpus"] == 1.0 and replicas.deployment(ServeConfig(replicas=2)).ray_actor_options["num_gpus"] == 0


def test_replicas_beyond_a_local_instance_are_named_not_waited_for():
    two = ServeConfig(device="cuda", replicas=2)
    assert two.placement_problem({"GPU": 2.0, "CPU": 32.0}) is None
    msg = two.placement_problem({"GPU": 1.0, "CPU": 32.0})
    assert "need 2 GPUs" in msg and "has 1" in msg and "--replicas" in msg
    assert "need 2 GPUs" in two.placement_problem({"CPU": 32.0})  # no GPU at all: Ray's dict has no key
    assert "need 4 CPUs" in ServeConfig(replicas=4).placement_problem({"CPU": 2.0})
    assert ServeConfig(replicas=4, cpus_per_replica=0.5).placement_problem({"CPU": 2.0}) is None


@pytest.mark.slow
def test_start_refuses_gpu_replicas_ray_cannot_place(monkeypatch):
    """On a machine with fewer GPUs than replicas, start() raises at once instead of serve.run waiting forever."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'hf-rstitch[serve-ray]'")
    import ray

    from hf_rstitch.serve import replicas

    monkeypatch.setattr(replicas, "local_gpus", lambda: 1)  # a one-GPU machine, whatever this one has
    cfg = ServeConfig(device="cuda", replicas=2, cpus_per_replica=0.5)
    with pytest.raises(RuntimeError, match="need 2 GPUs; this Ray instance has 1"):
        replicas.start(cfg, dict(num_cpus=2, object_store_memory=100 * 1024**2, log_to_driver=False))
    assert not ray.is_initialized()
    replicas.stop()  # nothing to stop: returns


@pytest.mark.parametrize("replicas, given, want", [(1, 1000.0, 1000.0), (2, 1000.0, 500.0), (4, 600.0, 150.0),
                                                   (2, 0.0, 0.0)])
def test_each_engine_replica_writes_its_share_of_the_stream_budget(replicas, given, want):
    """--stream-writes-per-s bounds all answers together: every replica's writes pass through the same proxy."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'hf-rstitch[serve-ray]'")
    from types import SimpleNamespace

    from hf_rstitch.serve import replicas as rep

    built = []

    def build(cfg):
        built.append(cfg)
        return SimpleNamespace(state=SimpleNamespace(driver=SimpleNamespace(start=lambda: None, drain=lambda s: None)))

    rep.RStitchReplica(ServeConfig(replicas=replicas, stream_writes_per_s=given), build)
    assert built[0].stream_writes_per_s == want and built[0].replicas == replicas
