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


@pytest.mark.parametrize("method", ["forecast", "decision", "grid"])
def test_seeds_min_above_the_seeds_is_refused_for_every_method_that_starts_keys_with_seeds_min(method):
    """The method says how many seeds a key starts with (SearchMethod.starts_with), not a test of its name: the
    default forecast and the decision start with seeds_min, the grid with every seed."""
    from rollscale.registry import SEARCH_METHODS

    params = {"sweep": {"seeds": [0, 1], "search": {"method": method, "seeds_min": 3}}}
    if SEARCH_METHODS.declared(method, "starts_with") == "seeds_min":
        with pytest.raises(ParamsError, match=rf"sweep.search.seeds_min \(3\) is more than the 2 seed\(s\) of "
                                              rf"sweep.seeds: under method {method} each key starts"):
            parse_params(params)
    else:
        assert parse_params(params).sweep.search.seeds_min == 3
    if method == "forecast":  # the default method, named or not
        with pytest.raises(ParamsError, match="under method forecast"):
            parse_params({"sweep": {"seeds": [0, 1], "search": {"seeds_min": 3}}})
    assert parse_params({"sweep": {"seeds": [0], "search": {"method": method}}}).sweep.search.seeds_min == 2


def test_the_search_identity_holds_every_setting_a_new_one_included():
    """A stored ``search`` table is reused only under the settings it was made with: the identity is every field
    of sweep.search, study and the sweep's own settings, so a setting added to a section is in it unedited."""
    import dataclasses

    from pydantic import create_model

    from rollscale.config import DecisionParams, SearchParams
    from rollscale.core.search.state import SearchSettings

    ident = SearchSettings(eval_every=4, sweep_seeds=3).identity()
    assert set(SearchParams.model_fields) | set(DecisionParams.model_fields) <= set(ident)
    assert {"eval_every", "eval_draws", "seeds_max"} <= set(ident) and ident["seeds_max"] == 3
    assert {f.name for f in dataclasses.fields(SearchSettings)} - {"search", "study", "sweep_seeds"} <= set(ident)
    Wider = create_model("Wider", __base__=SearchParams, rungs_to_skip=(int, 0))
    wider = SearchSettings(search=Wider(rungs_to_skip=1)).identity()
    assert wider["rungs_to_skip"] == 1 and wider != SearchSettings(search=Wider()).identity()
    for name in ("seeds_min", "key_max"):  # settings the hand-kept list had missed
        assert SearchSettings(SearchParams(**{name: 5})).identity() != SearchSettings().identity()


def test_the_forecast_form_is_one_field_validated_against_the_registered_forms():
    """``study.forecast_form`` (science §11.2): its default is the one the forms' module names, a form a module
    registers beside its own name is valid, an unknown one is one line naming the key and the forms; the search
    identity holds it, so a stored search made under another form is not reused."""
    from rollscale.config import DecisionParams
    from rollscale.core.fit import forms
    from rollscale.core.search.state import SearchSettings

    assert parse_params({}).study.forecast_form == forms.DEFAULT_FORM == DecisionParams().forecast_form
    assert set(forms.FORMS) | {"surface"} <= {parse_params({"study": {"forecast_form": f}}).study.forecast_form
                                              for f in [*forms.FORMS, "surface"]}
    with pytest.raises(ParamsError) as err:
        parse_params({"study": {"forecast_form": "decy"}})
    line = [ln for ln in str(err.value).splitlines() if "forecast_form" in ln]
    assert len(line) == 1 and "study.forecast_form" in line[0] and "did you mean 'decay'" in line[0]
    assert all(f in line[0] for f in [*forms.FORMS, "surface"])
    assert SearchSettings(study=DecisionParams(forecast_form="surface")).identity()["forecast_form"] == "surface"
    assert SearchSettings(study=DecisionParams(forecast_form="surface")).identity() != SearchSettings().identity()
