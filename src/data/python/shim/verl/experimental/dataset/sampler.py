"""verl's sampler interface (verl.experimental.dataset.sampler), as verl-ts supplies it to a python3
without verl: a sampler is built with (data_source, data_config) and iterated for row indices; a
curriculum sampler also gets update(batch=...) after each training step."""

from abc import abstractmethod

try:
    from torch.utils.data import Sampler as _Base
except ImportError:
    _Base = object


class AbstractSampler(_Base):
    @abstractmethod
    def __init__(self, data_source, data_config):
        pass


class AbstractCurriculumSampler(AbstractSampler):
    @abstractmethod
    def update(self, batch) -> None:
        pass
