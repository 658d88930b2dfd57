import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Token } from '@lumino/coreutils';

import { readSettings } from './completion';
import { CompletionState } from './completion_state';
import { CompletionSection } from './completion_view';
import { LLMInlineProvider } from './provider';
import { LLMSidebar } from './sidebar';

export { LLMClient, ExtensionMissingError } from './api';
export { LLMSidebar, SIDEBAR_ID, llmIcon } from './sidebar';
export { LLMInlineProvider, PROVIDER_ID } from './provider';

const COMMAND = 'jupyter-llm:open-sidebar';

/** The sidebar, for plugins that add a section to it. */
export const ILLMSidebar = new Token<LLMSidebar>('jupyter-llm:ILLMSidebar');

/**
 * Adds the sidebar to the shell's left area. Only `JupyterFrontEnd` is
 * required (no `ILabShell`), so it also runs in Notebook 7.
 */
const plugin: JupyterFrontEndPlugin<LLMSidebar> = {
  id: 'jupyter-llm:sidebar',
  description: 'Devices, memory and loaded models of jupyter-llm, in the left sidebar.',
  autoStart: true,
  provides: ILLMSidebar,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const sidebar = new LLMSidebar();
    app.shell.add(sidebar, 'left', { rank: 850 });
    if (restorer) {
      restorer.add(sidebar, sidebar.id);
    }
    app.commands.addCommand(COMMAND, {
      label: 'Show LLM Devices',
      caption: 'Devices, memory and loaded models of jupyter-llm',
      execute: () => app.shell.activateById(sidebar.id)
    });
    if (palette) {
      palette.addItem({ command: COMMAND, category: 'LLM' });
    }
    return sidebar;
  }
};

/**
 * Inline (ghost-text) completion in notebooks and the file editor, from the
 * model in the `jupyter-llm:completion` settings; the sidebar shows its state.
 */
const completion: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-llm:completion',
  description: 'Inline code completion from a local model (fill-in-the-middle).',
  autoStart: true,
  requires: [ICompletionProviderManager, ISettingRegistry],
  optional: [ILLMSidebar],
  activate: async (
    app: JupyterFrontEnd,
    manager: ICompletionProviderManager,
    registry: ISettingRegistry,
    sidebar: LLMSidebar | null
  ) => {
    const settings = await registry.load(completion.id);
    const state = new CompletionState(model => settings.set('model', model));
    const read = () => state.update(readSettings(settings.composite as Record<string, unknown>));
    read();
    settings.changed.connect(read);
    manager.registerInlineProvider(new LLMInlineProvider(state));
    if (sidebar) {
      sidebar.addSection(new CompletionSection(state));
    }
  }
};

export default [plugin, completion];
