"""``headcut prune``'s job: the request and its one check (:mod:`.request`), the recipe a prune runs
(:mod:`.recipes`), the stages of a round (:mod:`.stages`), the job itself (:mod:`.job`), its layer-wise path
(:mod:`.layerwise`, chosen by :mod:`.layerwise_choice`) and ``--target-speedup``'s timed search
(:mod:`.speed_target`)."""

from .job import prune
from .recipes import check_recipe, recipe_data, recipe_for

__all__ = ["check_recipe", "prune", "recipe_data", "recipe_for"]
