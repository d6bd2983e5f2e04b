"""The built-in metrics, one module each; every module of this package registers itself on
import (:func:`mlrc.registry.import_submodules`)."""
