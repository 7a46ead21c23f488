"""The Teach page (AppTest): pick a pattern, walk its slides with Previous/Next, scrub the
search frames, reveal the exercise's why-not answer; presentation mode scales the text."""

from streamlit.testing.v1 import AppTest


def _teach() -> AppTest:
    at = AppTest.from_file("../app/main.py", default_timeout=240)
    at.session_state["page_choice"] = "Teach"
    return at.run()


def _texts(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.success])


def _press(at: AppTest, key: str) -> AppTest:
    next(b for b in at.button if b.key == key).click()
    return at.run()


def test_teach_page_walks_a_batch_pattern_slide_by_slide():
    at = _teach()
    assert not at.exception
    assert at.session_state["teach_pattern"] == "batch_linear"
    assert "batch_linear: what it looks for" in _texts(at)
    assert "members do not depend on each other" in _texts(at)  # a precondition, as registered
    assert len(at.get("iframe")) == 1  # the graph before
    at = _press(at, "teach_next")
    assert at.session_state["teach_slide"] == 1 and "The search (global)" in _texts(at)
    sliders = [s for s in at.slider if s.key == "teach_frame"]
    assert sliders and sliders[0].max == 4
    sliders[0].set_value(3).run()
    assert "Independent layers" in _texts(at)
    at = _press(at, "teach_next")
    assert "A member that depends on another" in _texts(at)
    dep = next(s for s in at.slider if s.key == "teach_dep_frame")
    dep.set_value(dep.max).run()
    assert "left out: linear_5: depends on linear" in _texts(at)
    for _ in range(4):
        at = _press(at, "teach_next")
    assert "Exercise: why not?" in _texts(at)
    assert "slide 7 / 7" in " ".join(p.proto.text for p in at.get("progress"))  # the last slide
    assert next(b for b in at.button if b.key == "teach_next").disabled is True  # Next stops there
    assert "mutually independent" not in " ".join(s.value for s in at.success)
    at = _press(at, "teach_reveal")
    answer = " ".join(s.value for s in at.success)
    assert "optimus why linear_5" in answer and "mutually independent" in answer
    at = _press(at, "teach_prev")
    assert "What it bought" in _texts(at) and not at.exception
    assert next(b for b in at.button if b.key == "teach_next").disabled is False


def test_teach_page_switches_pattern_and_search():
    at = _teach()
    at.selectbox(key="teach_pattern").set_value("remove_split_cat").run()
    assert not at.exception and at.session_state["teach_slide"] == 0
    assert "remove_split_cat: what it looks for" in _texts(at)
    assert at.radio(key="teach_search").disabled
    at = _press(at, "teach_next")
    assert "Where it looks" in _texts(at)
    at.selectbox(key="teach_pattern").set_value("batch_relu").run()
    at.radio(key="teach_search").set_value("upstream").run()
    at = _press(at, "teach_next")
    assert "The search (upstream)" in _texts(at)
    assert "Ring 1 from output" in _texts(at)


def test_presentation_switch_scales_the_text():
    at = _teach()
    plain = next(m.value for m in at.markdown if "<h3" in m.value)
    at.session_state["presentation"] = True
    at.run()
    big = next(m.value for m in at.markdown if "<h3" in m.value)
    assert "font-size:1.50rem" in plain and "font-size:2.40rem" in big


def test_every_predefined_pattern_has_a_walkthrough_in_the_app(monkeypatch):
    from optimus_lens.app import teach as app_teach
    from optimus_lens.teach.lookup import predefined

    monkeypatch.setattr(app_teach, "REPEATS", 1)  # the figures are checked in test_teach; here every page renders
    at = _teach()
    for name in predefined():
        at.selectbox(key="teach_pattern").set_value(name).run()
        assert not at.exception, name
        assert f"{name}: what it looks for" in _texts(at), name
        assert len(at.get("iframe")) == 1, name  # the graph before
