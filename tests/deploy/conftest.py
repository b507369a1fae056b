"""Fixtures of the deploy tests: Helm's folders in a scratch dir, the loaded chart."""
import helm_python as helm
import pytest

from tests.deploy.render import CHART


@pytest.fixture(scope="session", autouse=True)
def helm_home(tmp_path_factory):
    """Helm's cache, config and data folders in a scratch dir (a CI home may be read-only or shared)."""
    home = tmp_path_factory.mktemp("helm-home")
    mp = pytest.MonkeyPatch()
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        mp.setenv(var, str(home / var.lower()))
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


