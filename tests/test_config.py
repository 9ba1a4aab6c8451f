"""params.yaml schema: defaults run, bad config names the key and what was expected."""

from pathlib import Path

import pytest
import yaml

from rollscale.config import ParamsError, StudyParams, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]


def test_defaults_and_repo_params_validate():
    p = StudyParams()
    assert p.model.kind == "tiny" and p.sampling.backend == "hf" and p.profile.k == 16
    # the committed params.yaml is valid and spells out every section
    repo = load_params(REPO / "params.yaml")
    assert set(yaml.safe_load((REPO / "params.yaml").read_text())) <= set(StudyParams.model_fields)
    assert repo.profile.k >= 1


def test_unknown_key_suggests_closest():
    with pytest.raises(ParamsError) as e:
        parse_params({"profile": {"kk": 8}})
    msg = str(e.value)
    assert "profile.kk: unknown key" in msg and "did you mean 'profile.k'" in msg


def test_unknown_section_suggests_closest():
    with pytest.raises(ParamsError, match=r"samplng: unknown key; did you mean 'sampling'"):
        parse_params({"samplng": {}})


def test_wrong_type_names_key():
    with pytest.raises(ParamsError, match=r"sampling\.temperature: .*number.*got 'hot'"):
        parse_params({"sampling": {"temperature": "hot"}})


@pytest.mark.parametrize(
    "bounds, expected",
    [([0.5, 1.5], r"bucket\.easy: .*\[0, 1\]"), ([0.6, 0.3], r"bucket\.easy: .*lower bound 0.6 is greater than upper bound 0.3")],
)
def test_bucket_bounds(bounds, expected):
    with pytest.raises(ParamsError, match=expected):
        parse_params({"bucket": {"easy": bounds}})


def test_k_at_least_one():
    with pytest.raises(ParamsError, match=r"profile\.k: .*greater than or equal to 1"):
        parse_params({"profile": {"k": 0}})


def test_missing_file_path():
    with pytest.raises(ParamsError, match=r"data\.path: .*file not found: /no/such/file.jsonl"):
        parse_params({"data": {"source": "gsm8k", "path": "/no/such/file.jsonl"}})


def test_mixture_validation():
    with pytest.raises(ParamsError, match=r"fractions must sum to 1"):
        parse_params({"bucket": {"mixtures": {"m": [["easy", 0.5], ["hard", 0.4]]}}})
    with pytest.raises(ParamsError, match=r"unknown bucket 'medium'"):
        parse_params({"bucket": {"mixtures": {"m": [["medium", 1.0]]}}})


def test_hf_model_needs_name():
    with pytest.raises(ParamsError, match=r"model\.name_or_path is required"):
        parse_params({"model": {"kind": "hf"}})


def test_load_params_file_errors(tmp_path):
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("profile: [1, 2\n")
    with pytest.raises(ParamsError, match=f"{bad}: not valid YAML"):
        load_params(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ParamsError, match="expected a mapping"):
        load_params(bad)


def test_vllm_engine_needs_one_worker():
    with pytest.raises(ParamsError, match=r"workers: sampling.backend 'vllm' runs one engine per worker"):
        parse_params({"sampling": {"backend": "vllm"}})
    assert parse_params({"sampling": {"backend": "vllm"}, "workers": 1}).sampling.backend == "vllm"
