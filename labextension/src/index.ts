import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { LLMSidebar } from './sidebar';

export { LLMClient, ExtensionMissingError } from './api';
export { LLMSidebar, SIDEBAR_ID, llmIcon } from './sidebar';

const COMMAND = 'jupyter-llm:open-sidebar';

/**
 * Adds the sidebar to the shell's left area. Only `JupyterFrontEnd` is
 * required (no `ILabShell`), so it also runs in Notebook 7.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-llm:sidebar',
  description: 'Devices, memory and loaded models of jupyter-llm, in the left sidebar.',
  autoStart: true,
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
  }
};

export default plugin;
