"""``petastorm.predicates``: unihub's row predicates."""

from unihub import PredicateBase, in_intersection, in_lambda, in_negate, in_pseudorandom_split, in_reduce, in_set

__all__ = ["PredicateBase", "in_intersection", "in_lambda", "in_negate", "in_pseudorandom_split", "in_reduce",
           "in_set"]
