"""Use IPython's hooks to neuter the test cells that would run after the exercise."""
THREAT = "later cells"
DEFENCE = ("Hidden tests are not cells: they run in the judge. get_ipython() in the worker "
           "returns an inert object, so handlers, transformers and callbacks register nothing.")
TRICK = '''\
ip = get_ipython()
ip.set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: None)
ip.input_transformers_post.append(lambda lines: ["pass\\n"])
ip.input_transformers_cleanup.append(lambda lines: ["pass\\n"])
ip.events.register("pre_run_cell", lambda *args: None)
ip.events.register("post_run_cell", lambda result: setattr(result, "error_in_exec", None))
ip.ast_transformers.append(None)
%config InteractiveShell.ast_node_interactivity = "none"
'''
